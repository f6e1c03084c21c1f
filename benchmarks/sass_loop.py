"""The hot loop of a kernel's SASS: the backward branch that encloses the most tensor-core
instructions, with its size and the opcodes it spends (static counts, as ``cuobjdump
--dump-sass`` lists them). ``ptx_report --sass`` prints it per decode kernel, so a change to
the decode loop is weighed in instructions on a CPU before it costs GPU time.

Static counts include branches a warp rarely takes (the softmax rescale, the table refill
once per 32 blocks): read them as an upper bound of what one iteration issues.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import NamedTuple

_LINE = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)[^;]*;")
_TARGET = re.compile(r"\bBRA(?:\.\w+)*\s+(?:\w+,\s*)?(0x[0-9a-f]+)")


class HotLoop(NamedTuple):
    """A loop ``[start, end]`` (byte addresses) of ``size`` instructions; ``ops`` counts its
    opcodes (the mnemonic before the first dot)."""

    start: int
    end: int
    size: int
    ops: Counter


def instructions(sass: str) -> list[tuple[int, str, int | None]]:
    """(address, opcode, target) of every instruction in ``sass``; the target is the address
    a predicated branch goes to, else None (an unpredicated backward branch is the return
    from out-of-line code, such as a divergent-shuffle fallback, not a loop)."""
    out = []
    for line in sass.splitlines():
        m = _LINE.search(line)
        if m:
            target = _TARGET.search(line) if m.group(2) else None
            out.append((int(m.group(1), 16), m.group(3), int(target.group(1), 16) if target else None))
    return out


def hot_loop(sass: str, opcode: str = "HMMA") -> HotLoop | None:
    """The loop (a backward branch's span) holding the most ``opcode`` instructions. Among
    equals, the innermost (one that encloses no other of them), and of those the first in
    the code: in an FP16 decode kernel the sealed blocks' k-step loop and the tail's hold the
    same mma count, and the sealed one comes first in the plain and verify kernels alike
    (taking the shortest compared the verify kernel's tail loop with the plain kernel's block
    loop). None when no loop holds one."""
    insts = instructions(sass)
    loops = []
    for address, _, target in insts:
        if target is None or target >= address:
            continue
        body = [op for a, op, _ in insts if target <= a <= address]
        loops.append(HotLoop(target, address, len(body), Counter(body)))
    most = max((loop.ops[opcode] for loop in loops), default=0)
    if not most:
        return None
    best = [loop for loop in loops if loop.ops[opcode] == most]
    inner = [loop for loop in best if not any(o is not loop and loop.start <= o.start and o.end <= loop.end
                                              for o in best)]
    return min(inner, key=lambda loop: (loop.start, loop.size))


def describe(loop: HotLoop | None, top: int = 8) -> str:
    """One line: size, span and the most frequent opcodes."""
    if loop is None:
        return "no loop with tensor-core instructions"
    ops = ", ".join(f"{op} {n}" for op, n in loop.ops.most_common(top))
    return f"hot loop {loop.size} instructions (0x{loop.start:x}..0x{loop.end:x}): {ops}"


def difference(base: HotLoop | None, other: HotLoop | None, top: int = 8) -> str:
    """One line: how many more instructions ``other``'s loop has than ``base``'s, by opcode
    (the ``top`` largest changes first; e.g. a decode kernel's verify variant against the
    plain kernel: what checking a block adds to each pass)."""
    if base is None or other is None:
        return "no loop to compare"
    change = Counter(other.ops)
    change.subtract(base.ops)
    moved = sorted(((op, n) for op, n in change.items() if n), key=lambda item: (-abs(item[1]), item[0]))
    ops = ", ".join(f"{op} {n:+d}" for op, n in moved[:top])
    return f"{other.size - base.size:+d} instructions a pass ({base.size} -> {other.size}): {ops}"
