"""benchmarks.ncu_source: an ncu source page split into before, in and after the hot loop."""

import gzip

import pytest

from benchmarks import ncu_source

HEAD = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_long_sb",
        "stall_wait", "stall_long_sb (Not Issued)"]
ROWS = [  # a prologue, a loop of four instructions run 16 times (an inner pair twice as often), an epilogue
    ["0x00", "LDC R1, c[0x0][0x28]", "3", "4", "0", "3", "9"],
    ["0x10", "HMMA.16816.F32 R4, R8, R12, R4", "1", "4", "1", "0", "9"],  # not the loop: run 4 times
    ["0x20", "@P0 LDGSTS.E.BYPASS.128 [R2], desc[UR4][R6.64]", "5", "16", "5", "0", "9"],
    ["0x30", "HMMA.16816.F32 R4, R8, R12, R4", "2", "16", "0", "2", "9"],
    ["0x40", "LOP3.LUT R3, R3, 0x3, RZ, 0xc0, !PT", "1", "32", "0", "1", "9"],
    ["0x50", "@!P1 BRA 0x20", "4", "16", "4", "0", "9"],
    ["0x60", "EXIT", "0", "4", "0", "0", "9"],
]


@pytest.fixture
def page(tmp_path):
    text = "\n".join([",".join(f'"{c}"' for c in ["Kernel Name", "kernel"])] +
                     [",".join(f'"{c}"' for c in r) for r in [HEAD] + ROWS]) + "\n"
    path = tmp_path / "page.csv.gz"
    path.write_bytes(gzip.compress(text.encode()))
    return str(path)


def test_parts_split_at_the_loop_of_the_busiest_mma(page):
    head, rows = ncu_source.read_source(page)
    assert ncu_source.loop_span(head, rows) == (2, 5, 16)
    before, loop, after = ncu_source.parts(head, rows)
    assert (before.instructions, before.samples, before.reasons["wait"]) == (8, 4, 3)
    assert (loop.instructions, loop.samples) == (80, 12)
    assert loop.reasons == {"long_sb": 9, "wait": 3}  # the not-issued column is not a reason
    assert (after.instructions, after.samples) == (4, 0)


def test_loop_opcodes_are_per_iteration(page):
    ops = ncu_source.loop_opcodes(*ncu_source.read_source(page))
    assert ops == {"LDGSTS": 1, "HMMA": 1, "LOP3": 2, "BRA": 1}


def test_main_prints_the_parts(page, capsys):
    ncu_source.main([page, "--loop"])
    out = capsys.readouterr().out
    assert "hot loop" in out and "long_sb 9" in out and "per iteration: 5: LOP3 2.0" in out


def test_pages_of_several_kernels_are_read_in_turn(tmp_path):
    page = [["Kernel Name", "one"], HEAD] + ROWS + [["Kernel Name", "two"], HEAD] + ROWS[:3]
    path = tmp_path / "two.csv"
    path.write_text("\n".join(",".join(f'"{c}"' for c in r) for r in page) + "\n")
    pages = ncu_source.read_pages(str(path))
    assert [(name, len(rows)) for name, _head, rows in pages] == [("one", 7), ("two", 3)]
    assert ncu_source.read_source(str(path))[1] == ROWS


def test_a_file_without_a_source_page_is_refused(tmp_path):
    path = tmp_path / "raw.csv"
    path.write_text('"ID","Kernel Name"\n"0","kernel"\n')
    with pytest.raises(SystemExit, match="not an ncu source page"):
        ncu_source.read_source(str(path))
