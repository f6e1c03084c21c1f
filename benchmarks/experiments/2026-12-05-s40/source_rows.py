"""Summarise an ``ncu -i REP --page source --csv --print-source sass`` file (one row per SASS
instruction): its columns, each stall-sample column's total, samples by 1 KB of code, and the
instructions with the most samples (of the "no instruction" column when there is one).

    python3 source_rows.py FILE.csv
"""
import csv
import sys


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main(path: str) -> None:
    with open(path) as f:
        rows = [r for r in csv.reader(f) if len(r) > 3]
    if not rows:
        print("no rows")
        return
    head, body = rows[0], rows[1:]
    print("columns:", " | ".join(head))
    addr = next(i for i, h in enumerate(head) if "Address" in h)
    src = next((i for i, h in enumerate(head) if h.strip() == "Source"), addr + 1)
    samples = [i for i, h in enumerate(head) if "ampl" in h or "stall" in h.lower()]
    body = [r for r in body if r[addr].strip().startswith("0x") or r[addr].strip().isdigit()]
    print(f"{len(body)} instructions")
    for i in samples:
        print(f"total {head[i]}: {sum(number(r[i]) for r in body):.0f}")
    want = next((i for i in samples if "no_inst" in head[i].lower() and "Not" not in head[i]),
                samples[0] if samples else None)
    if want is None:
        return
    every = samples[0]
    buckets: dict[int, list[float]] = {}
    for r in body:
        a = int(r[addr], 16) if r[addr].strip().startswith("0x") else int(r[addr])
        b = buckets.setdefault(a // 1024, [0.0, 0.0])
        b[0] += number(r[every])
        b[1] += number(r[want])
    print(f"by 1 KB of code: [{head[every]}, {head[want]}], the 24 biggest by the second")
    for k, (s, w) in sorted(buckets.items(), key=lambda kv: -kv[1][1])[:24]:
        print(f"  0x{k * 1024:06x}: {s:8.0f} {w:8.0f}")
    print(f"the 30 instructions with the most {head[want]}")
    for r in sorted(body, key=lambda r: -number(r[want]))[:30]:
        print(f"  {r[addr]:>8} {number(r[want]):7.0f} {number(r[every]):7.0f}  {r[src][:80]}")


if __name__ == "__main__":
    main(sys.argv[1])
