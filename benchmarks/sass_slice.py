"""What a persistent slice costs besides its items, read from the slice kernel's SASS (static
counts, as ``cuobjdump --dump-sass`` lists them): ``ptx_report --persistent`` prints it.

Regions, by address (the item is inlined between them):

- *start*: entry to the barrier that publishes the first item, i.e. the first ``BAR.SYNC``
  after the ``START`` compare-and-swap (``ATOMG.E.CAS``; with static first items there may
  be no queue take before it on the common path, and the region holds the rare owed and
  repair paths too);
- *end*: after the kernel's last ``BAR.SYNC`` (the loop's) to its last ``EXIT``; split at the
  first atomic there whose result is used (the ``EXITED`` count): *per CTA* up to and
  including the ``EXIT`` after it, *last CTA* the rest (the slice's close, the log, the
  merge counters' clearing loop of a ``LAST`` slice).

Global memory operations are counted by kind: atomics (``ATOMG``/``ATOM``/``RED``, with or
without a result), fences (``MEMBAR``), L1 invalidations (``CCTL``), loads (``LDG``), stores
(``STG``), and ``%globaltimer`` reads. Static counts include both sides of branches.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import NamedTuple

_LINE = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
KINDS = {"atomic": ("ATOMG", "ATOM.", "RED"), "fence": ("MEMBAR",), "cctl": ("CCTL",), "load": ("LDG.",),
         "store": ("STG.",), "barrier": ("BAR.SYNC",)}


class Region(NamedTuple):
    """``size`` instructions; ``ops``: counts per kind of KINDS plus ``timer``."""

    size: int
    ops: Counter


class SliceCost(NamedTuple):
    """The regions of one slice kernel and its whole-kernel counts (``kernel``)."""

    start: Region
    end_per_cta: Region
    end_last_cta: Region
    kernel: Region


def _instructions(sass: str) -> list[tuple[str, str]]:
    """(opcode with modifiers, operands) of every instruction, in address order."""
    return [(m.group(3), m.group(4)) for m in map(_LINE.search, sass.splitlines()) if m]


def _region(insts: list[tuple[str, str]]) -> Region:
    ops = Counter()
    for op, operands in insts:
        for kind, prefixes in KINDS.items():
            ops[kind] += op.startswith(prefixes) or op == "ATOM"
        ops["timer"] += "SR_GLOBALTIMER" in operands
    return Region(len(insts), ops)


def _returns(op: str, operands: str) -> bool:
    """An atomic whose result is used (its destination is not RZ)."""
    fields = [f.strip() for f in operands.split(",")]
    return op.startswith(("ATOMG", "ATOM")) and len(fields) > 1 and fields[1] != "RZ"


def slice_cost(sass: str) -> SliceCost:
    """The start and end regions (see the module docstring) of a slice kernel's SASS."""
    insts = _instructions(sass)
    cas = next(i for i, (op, _) in enumerate(insts) if op.startswith("ATOMG.E.CAS"))
    start = next(i for i in range(cas, len(insts)) if insts[i][0].startswith("BAR.SYNC"))
    last_bar = max(i for i, (op, _) in enumerate(insts) if op.startswith("BAR.SYNC"))
    last_exit = max(i for i, (op, _) in enumerate(insts) if op == "EXIT")
    end = insts[last_bar + 1:last_exit + 1]
    exited = next(i for i, (op, rest) in enumerate(end) if _returns(op, rest))
    split = next(i for i in range(exited, len(end)) if end[i][0] == "EXIT") + 1
    return SliceCost(_region(insts[:start + 1]), _region(end[:split]), _region(end[split:]), _region(insts))


def describe(cost: SliceCost) -> str:
    """One line per region: its size and memory operations."""
    def line(name, region):
        kinds = ", ".join(f"{k} {region.ops[k]}" for k in (*KINDS, "timer"))
        return f"{name}: {region.size} instructions ({kinds})"
    return "\n    ".join(line(n, r) for n, r in zip(("start", "end per CTA", "end last CTA", "kernel"), cost))
