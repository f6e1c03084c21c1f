"""benchmarks.sass_loop: the hot loop of a SASS listing (pure text; no GPU, no ptxas)."""

from collections import Counter

from benchmarks.sass_loop import HotLoop, describe, difference, hot_loop


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


def test_hot_loop_among_equals_takes_the_innermost_first_in_the_code():
    """An FP16 decode kernel: an outer block loop around a k-step loop, then a tail loop with
    the same mma count, shorter than the k-step loop: the k-step loop is the one."""
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E R2, desc[UR4][R2.64] ;
        /*0020*/                   HMMA.16816.F32 R4, R8, R12, RZ ;
        /*0030*/                   LOP3.LUT R2, R3, 0xf, RZ, 0xc0, !PT ;
        /*0040*/                   SHF.R.U32.HI R2, RZ, 0x10, R2 ;
        /*0050*/               @P0 BRA 0x20 ;
        /*0060*/               @P1 BRA 0x10 ;
        /*0070*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0080*/               @P2 BRA 0x70 ;
        /*0090*/                   EXIT ;
    """
    loop = hot_loop(sass)
    assert (loop.start, loop.end, loop.size) == (0x20, 0x50, 4)


def test_difference_counts_what_one_loop_adds_by_opcode():
    plain = HotLoop(0, 0x50, 6, Counter({"HMMA": 2, "LDS": 2, "LEA": 1, "BRA": 1}))
    verify = HotLoop(0, 0xa0, 11, Counter({"HMMA": 2, "LDS": 3, "IMAD": 2, "SHF": 3, "BRA": 1}))
    assert difference(plain, verify) == "+5 instructions a pass (6 -> 11): SHF +3, IMAD +2, LDS +1, LEA -1"
    assert difference(verify, plain, top=1) == "-5 instructions a pass (11 -> 6): SHF -3"
    assert difference(None, verify) == "no loop to compare"
