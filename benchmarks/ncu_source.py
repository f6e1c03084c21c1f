"""Where one kernel's warp time goes, from Nsight Compute's source page: per SASS
instruction, how often it ran and the warp-state samples that fell on it.

    ncu --kernel-name-base demangled -k regex:decode_kernel --launch-skip 2 --launch-count 1 \\
        --section SourceCounters --section WarpStateStats -o REPORT python3 -m benchmarks.profile_decode int2 1
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass | gzip > SOURCE.csv.gz
    python -m benchmarks.ncu_source SOURCE.csv.gz [--loop]
    python -m benchmarks.ncu_source SOURCE.csv.gz --per-cta OTHER.csv.gz

Prints the warp instructions and the stall samples (with their four largest reasons) before
the hot loop, in it and after it, the hot loop being everything between the first and the
last instruction run at least half as often as the most run tensor-core instruction (a
decode kernel's block loop; inner loops and rarely taken branches inside it are counted with
it); with ``--loop``, the loop's instructions per iteration by opcode (executions divided by
that busiest mma's). The file may be gzipped or plain, and may hold the pages of several
profiled kernels (each after its "Kernel Name" row): each is printed in turn.

The span misleads where a CTA's own fixed work runs about as often as the loop (a decode of
few blocks a warp: the epilogue's loops fall inside it). ``--per-cta OTHER`` compares two
launches of the same kernel binary over the same work cut into different grids (say 32 and
49 splits of one decode; the first page of each file): the instructions whose executions
scale exactly with the warps launched (the kernel's first instruction runs once a warp) are
each CTA's fixed work, wherever they lie; the rest is the work itself (``per_cta``).
"""

from __future__ import annotations

import csv
import gzip
import re
import sys
from collections import Counter
from typing import NamedTuple

_OPCODE = re.compile(r"\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


class Part(NamedTuple):
    """One part of the kernel: its name, warp instructions executed, stall samples and
    samples per stall reason (``stall_`` prefix dropped, not-issued columns left out)."""

    name: str
    instructions: int
    samples: int
    reasons: Counter


def _number(text: str) -> int:
    text = text.replace(",", "")
    return int(text) if text.isdigit() else 0


def read_pages(path: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(kernel name, header, instruction rows) of each kernel's page in an ncu ``--page source
    --csv`` file, in file order."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    pages, name, head = [], "", None
    for r in rows:
        if r and r[0] == "Kernel Name":
            name, head = (r[1] if len(r) > 1 else ""), None
        elif r and r[0] == "Address":
            head = r
            pages.append((name, head, []))
        elif head is not None and len(r) == len(head):
            pages[-1][2].append(r)
    if not pages:
        raise SystemExit(f"{path}: no 'Address' header row: not an ncu source page")
    return pages


def read_source(path: str) -> tuple[list[str], list[list[str]]]:
    """The header and the instruction rows of the first kernel's page in ``path``."""
    _name, head, rows = read_pages(path)[0]
    return head, rows


def executed(head: list[str], rows: list[list[str]]) -> list[int]:
    """Each row's warp instructions executed."""
    ran = head.index("Instructions Executed")
    return [_number(r[ran]) for r in rows]


def loop_span(head: list[str], rows: list[list[str]]) -> tuple[int, int, int]:
    """(first row, last row, executions of the busiest mma) of the hot loop."""
    counts = executed(head, rows)
    mma = [counts[i] for i, r in enumerate(rows) if "HMMA" in r[1]]
    if not mma or max(mma) == 0:
        raise SystemExit("no tensor-core instruction ran: no hot loop to find")
    top = max(mma)
    hot = [i for i, n in enumerate(counts) if n >= top * 0.5]
    return hot[0], hot[-1], top


def parts(head: list[str], rows: list[list[str]]) -> list[Part]:
    """The kernel before its hot loop, the loop, and after it."""
    counts = executed(head, rows)
    first, last, _ = loop_span(head, rows)
    return [_part(name, head, rows, span, counts)
            for name, span in (("before the loop", range(0, first)), ("hot loop", range(first, last + 1)),
                               ("after the loop", range(last + 1, len(rows))))]


def loop_opcodes(head: list[str], rows: list[list[str]]) -> Counter:
    """The hot loop's instructions per iteration (executions over the busiest mma's), by opcode."""
    counts = executed(head, rows)
    first, last, top = loop_span(head, rows)
    ops = Counter()
    for r, n in zip(rows[first:last + 1], counts[first:last + 1]):
        m = _OPCODE.match(r[1])
        ops[m.group(1) if m else "?"] += n / top
    return ops


_HEX = re.compile(r"0x[0-9a-f]+")


def _relative_source(rows: list[list[str]]) -> list[str]:
    """Each row's SASS with every hex number inside the page's own address range (a branch
    target: ncu prints absolute addresses, different in every profile) made an offset from the
    page's first instruction; immediates outside that range stay as they are."""
    base, end = int(rows[0][0], 16), int(rows[-1][0], 16) + 16

    def offset(m):
        value = int(m[0], 16)
        return f"@{value - base:x}" if base <= value < end else m[0]

    return [_HEX.sub(offset, r[1]) for r in rows]


def _part(name: str, head: list[str], rows: list[list[str]], span, counts: list[int]) -> Part:
    """The rows ``span`` as one part: instructions executed (``counts``), stall samples and
    samples per reason."""
    sampled = head.index("Warp Stall Sampling (All Samples)")
    reasons = [j for j, h in enumerate(head) if h.startswith("stall_") and "Not Issued" not in h]
    why = Counter()
    for i in span:
        for j in reasons:
            why[head[j][len("stall_"):]] += _number(rows[i][j])
    return Part(name, sum(counts[i] for i in span), sum(_number(rows[i][sampled]) for i in span), why)


def per_cta(page_a: tuple[list[str], list[list[str]]],
            page_b: tuple[list[str], list[list[str]]]) -> tuple[int, int, list[Part], list[Part]]:
    """(warps of launch a, warps of launch b, a's parts, b's parts), each launch's parts being
    "per CTA" (the instructions whose executions in b are exactly theirs in a times the ratio
    of warps launched, b's warps over a's, and not zero: each CTA's fixed work) and "the rest".
    ``page_a``/``page_b``: (header, rows) of ``read_source``; the two must be one binary (the
    same instructions, branch targets taken relative to each page's start) and launch
    different, nonzero numbers of warps (the kernel's first instruction runs once a warp)."""
    rows_a, rows_b = page_a[1], page_b[1]
    if len(rows_a) != len(rows_b) or _relative_source(rows_a) != _relative_source(rows_b):
        raise SystemExit("per_cta: the two pages are not one kernel binary")
    counts = [executed(head, rows) for head, rows in (page_a, page_b)]
    warps_a, warps_b = counts[0][0], counts[1][0]
    if not warps_a or not warps_b or warps_a == warps_b:
        raise SystemExit(f"per_cta: the launches ran {warps_a} and {warps_b} warps; they must differ, neither 0")
    scales = [a > 0 and b * warps_a == a * warps_b for a, b in zip(*counts)]
    fixed = [i for i, f in enumerate(scales) if f]
    rest = [i for i, f in enumerate(scales) if not f]
    return warps_a, warps_b, *([_part("per CTA", head, rows, fixed, count), _part("the rest", head, rows, rest, count)]
                               for (head, rows), count in zip((page_a, page_b), counts))


def main(argv: list[str]) -> None:
    if not argv or argv[0].startswith("-"):
        raise SystemExit("usage: python -m benchmarks.ncu_source SOURCE.csv[.gz] [--loop | --per-cta OTHER.csv[.gz]]")
    if "--per-cta" in argv:
        if "--loop" in argv:
            raise SystemExit("--loop and --per-cta: one at a time")
        at = argv.index("--per-cta") + 1
        if at == len(argv):
            raise SystemExit("--per-cta needs a second source page")
        other = argv[at]
        print_per_cta(argv[0], other, *per_cta(read_source(argv[0]), read_source(other)))
        return
    for name, head, rows in read_pages(argv[0]):
        print_page(f"{argv[0]}: {name[:60]}", head, rows, "--loop" in argv)


def print_per_cta(path_a: str, path_b: str, warps_a: int, warps_b: int, parts_a: list[Part],
                  parts_b: list[Part]) -> None:
    """``per_cta``'s answer, as ``main`` prints it."""
    for path, warps, got in ((path_a, warps_a, parts_a), (path_b, warps_b, parts_b)):
        total_i, total_s = sum(p.instructions for p in got) or 1, sum(p.samples for p in got) or 1
        print(f"{path}: {warps:,} warps, {total_i:,} warp instructions, {total_s} stall samples")
        for p in got:
            top = ", ".join(f"{k} {v}" for k, v in p.reasons.most_common(4))
            print(f"  {p.name:9s} {p.instructions:>12,} instructions ({100 * p.instructions / total_i:4.1f}%, "
                  f"{p.instructions / warps:,.0f} a warp) {p.samples:>7} samples ({100 * p.samples / total_s:4.1f}%)"
                  f"  {top}")


def print_page(title: str, head: list[str], rows: list[list[str]], loop: bool) -> None:
    """One kernel's parts (and with ``loop`` its loop's opcodes), as ``main`` prints them."""
    got = parts(head, rows)
    total = sum(p.samples for p in got) or 1
    print(f"{title}: {sum(p.instructions for p in got):,} warp instructions, {total} stall samples")
    for p in got:
        top = ", ".join(f"{k} {v}" for k, v in p.reasons.most_common(4))
        share = 100 * p.samples / total
        print(f"  {p.name:16s} {p.instructions:>12,} instructions {p.samples:>7} samples ({share:4.1f}%)  {top}")
    if loop:
        ops = loop_opcodes(head, rows)
        print(f"  per iteration: {round(sum(ops.values()))}: "
              + ", ".join(f"{k} {v:.1f}" for k, v in ops.most_common(24)))


if __name__ == "__main__":
    main(sys.argv[1:])
