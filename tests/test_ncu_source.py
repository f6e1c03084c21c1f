"""benchmarks.ncu_source: an ncu source page split into before, in and after the hot loop; two
launches of one binary split into each CTA's fixed work and the rest (``per_cta``)."""

import gzip
import re

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


def _page_file(tmp_path, name, rows, base=0x7FC600000000):
    # a source page as ncu writes it: absolute addresses from `base`, branch targets among them
    # (different in every profile)
    out = []
    for r in rows:
        address = base + int(r[0], 16)
        source = re.sub(r"BRA 0x([0-9a-f]+)", lambda m: f"BRA {hex(base + int(m[1], 16))}", r[1])
        out.append([hex(address), source] + r[2:])
    path = tmp_path / name
    path.write_text("\n".join(",".join(f'"{c}"' for c in r) for r in [["Kernel Name", "k"], HEAD] + out) + "\n")
    return str(path)


# ROWS and four more: a row never run, one run only in the second launch, one run nearly (not
# exactly) in the ratio of the warps, a wide immediate (not an address: kept as it is)
EXTRA = [
    ["0x70", "LOP3.LUT R3, R3, 0xffffff80, RZ, 0xc0, !PT", "0", "0", "0", "0", "9"],
    ["0x80", "IADD3 R1, R1, 0x1, RZ", "0", "0", "0", "0", "9"],
    ["0x90", "FADD R2, R2, R3", "1", "16", "0", "1", "9"],
    ["0xa0", "EXIT", "0", "0", "0", "0", "9"],
]
CTA_ROWS = (0, 1, 6)  # run once a warp: the kernel's first instruction, the HMMA before the loop, EXIT


def _regridded(rows, per_cta, rest, only_b=0):
    # rows launched on another grid: the per-CTA rows' counts times per_cta, the others times
    # rest; the row run only here gets only_b; the nearly-scaling one 31 where a has 16
    out = []
    for i, r in enumerate(rows):
        count = int(r[3]) * (per_cta if i in CTA_ROWS else rest)
        count = only_b if i == 8 else 31 if i == 9 else count
        out.append(r[:2] + ["1", str(count)] + r[4:])
    return out


def test_per_cta_counts_exactly_the_rows_that_scale_with_the_warps(tmp_path):
    rows = ROWS + EXTRA
    a = _page_file(tmp_path, "a.csv", rows)
    b = _page_file(tmp_path, "b.csv", _regridded(rows, 2, 3, only_b=5), base=0x7FD600000000)
    warps_a, warps_b, parts_a, parts_b = ncu_source.per_cta(ncu_source.read_source(a), ncu_source.read_source(b))
    assert (warps_a, warps_b) == (4, 8)
    (fixed_a, rest_a), (fixed_b, rest_b) = parts_a, parts_b
    assert (fixed_a.name, fixed_a.instructions, fixed_a.samples, fixed_a.reasons["wait"]) == ("per CTA", 12, 4, 3)
    # the rest: the loop's rows, the row never run, the one run only in b, the nearly scaling one
    assert (rest_a.name, rest_a.instructions, rest_a.samples, rest_a.reasons["long_sb"]) == ("the rest", 96, 13, 9)
    assert (fixed_b.instructions, rest_b.instructions) == (24, 3 * 80 + 5 + 31)
    assert (fixed_b.samples, rest_b.samples) == (3, 8)  # b's own samples


def test_per_cta_refuses_two_binaries_or_one_grid_or_none(tmp_path):
    read = ncu_source.read_source
    a = _page_file(tmp_path, "a.csv", ROWS + EXTRA)
    changed = [r if i != 7 else r[:1] + ["LOP3.LUT R3, R3, 0xffffff40, RZ, 0xc0, !PT"] + r[2:]
               for i, r in enumerate(ROWS + EXTRA)]  # an immediate changed, not an address
    other = _page_file(tmp_path, "other.csv", _regridded(changed, 2, 1), base=0x7FD600000000)
    with pytest.raises(SystemExit, match="not one kernel binary"):
        ncu_source.per_cta(read(a), read(other))
    with pytest.raises(SystemExit, match="must differ"):
        ncu_source.per_cta(read(a), read(_page_file(tmp_path, "b.csv", ROWS + EXTRA, base=0x7FD600000000)))
    none = _page_file(tmp_path, "none.csv", _regridded(ROWS + EXTRA, 0, 0))
    with pytest.raises(SystemExit, match="neither 0"):
        ncu_source.per_cta(read(a), read(none))


def test_main_prints_per_cta(tmp_path, capsys):
    a = _page_file(tmp_path, "a.csv", ROWS)
    b = _page_file(tmp_path, "b.csv", _regridded(ROWS, 3, 1), base=0x7FD600000000)
    ncu_source.main([a, "--per-cta", b])
    out = capsys.readouterr().out
    assert "4 warps" in out and "12 warps" in out and ", 3 a warp)" in out
    with pytest.raises(SystemExit, match="needs a second source page"):
        ncu_source.main([a, "--per-cta"])
    with pytest.raises(SystemExit, match="one at a time"):
        ncu_source.main([a, "--per-cta", b, "--loop"])
