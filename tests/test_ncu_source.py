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


def _page_file(tmp_path, name, rows, base="0x7fc600000"):
    # branch targets as ncu prints them: absolute addresses, different in every profile
    rows = [r[:1] + [r[1].replace("BRA 0x", f"BRA {base}")] + r[2:] for r in rows]
    path = tmp_path / name
    path.write_text("\n".join(",".join(f'"{c}"' for c in r) for r in [["Kernel Name", "k"], HEAD] + rows) + "\n")
    return str(path)


def _regridded(factor_per_cta, factor_rest):
    # ROWS launched on another grid: the kernel's first instruction, the HMMA before the loop and
    # EXIT run once a warp (times factor_per_cta), the loop's rows times factor_rest
    out = []
    for i, r in enumerate(ROWS):
        factor = factor_per_cta if i in (0, 1, 6) else factor_rest
        out.append(r[:2] + ["1", str(int(r[3]) * factor)] + r[4:])
    return out


def test_per_cta_finds_the_instructions_that_scale_with_the_warps(tmp_path):
    a = _page_file(tmp_path, "a.csv", ROWS)
    b = _page_file(tmp_path, "b.csv", _regridded(2, 1), base="0x7fd600000")  # twice the warps, the same loop
    warps_a, warps_b, parts_a, parts_b = ncu_source.per_cta(ncu_source.read_source(a), ncu_source.read_source(b))
    assert (warps_a, warps_b) == (4, 8)
    (fixed_a, rest_a), (fixed_b, rest_b) = parts_a, parts_b
    assert (fixed_a.name, fixed_a.instructions, fixed_a.samples, fixed_a.reasons["wait"]) == ("per CTA", 12, 4, 3)
    assert (rest_a.instructions, rest_a.samples, rest_a.reasons["long_sb"]) == (80, 12, 9)
    assert (fixed_b.instructions, rest_b.instructions) == (24, 80)
    assert (fixed_b.samples, rest_b.samples) == (3, 4)  # b's own samples


def test_per_cta_refuses_two_binaries_or_one_grid(tmp_path):
    a = _page_file(tmp_path, "a.csv", ROWS)
    other = _page_file(tmp_path, "other.csv", [ROWS[0], ["0x10", "FFMA R4, R8, R12, R4"] + ROWS[1][2:]] + ROWS[2:])
    with pytest.raises(SystemExit, match="not one kernel binary"):
        ncu_source.per_cta(ncu_source.read_source(a), ncu_source.read_source(other))
    with pytest.raises(SystemExit, match="must differ"):
        ncu_source.per_cta(ncu_source.read_source(a), ncu_source.read_source(_page_file(tmp_path, "b.csv", ROWS)))


def test_main_prints_per_cta(tmp_path, capsys):
    a, b = _page_file(tmp_path, "a.csv", ROWS), _page_file(tmp_path, "b.csv", _regridded(3, 1), base="0x7fd600000")
    ncu_source.main([a, "--per-cta", b])
    out = capsys.readouterr().out
    assert "4 warps" in out and "12 warps" in out and ", 3 a warp)" in out
