"""benchmarks.sass_loop: the hot loop of a SASS listing (pure text; no GPU, no ptxas)."""

from collections import Counter

from benchmarks.sass_loop import describe, hot_loop


def test_hot_loop_finds_the_loop_with_the_most_mma():
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HMMA.16816.F32 R4, R8, R12, RZ ;
        /*0020*/               @P0 BRA 0x10 ;
        /*0030*/                   LOP3.LUT R2, R3, 0xf, RZ, 0xc0, !PT ;
        /*0040*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0050*/                   HMMA.16816.F32 R4, R8, R14, R4 ;
        /*0060*/              @!P1 BRA 0x30 ;
        /*0070*/                   EXIT ;
        /*0080*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0090*/                   BRA 0x0 ;
    """
    loop = hot_loop(sass)
    assert (loop.start, loop.end, loop.size) == (0x30, 0x60, 4)
    assert loop.ops == Counter({"HMMA": 2, "LOP3": 1, "BRA": 1})  # not 0x0..0x90: an unpredicated return
    assert describe(loop).startswith("hot loop 4 instructions (0x30..0x60): HMMA 2")
    assert hot_loop("/*0000*/ EXIT ;") is None
