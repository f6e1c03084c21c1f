"""The ``ab`` call's rows side by side: us per (kernel, shape, grid) for each tree, its rounds
in order, from the decode_<tree>.json files ab_rows.py wrote into the folder given.

    python benchmarks/experiments/2026-12-07-s62/ab_table.py DIR
"""
import glob
import json
import os
import sys

rows = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "decode_*.json"))):
    tree = os.path.basename(path)[len("decode_"):-len(".json")]  # ab_rows.py's --name
    for r in json.load(open(path))["rows"]:
        key = (r["kernel"], r["B"], r["Hq"], r["ctx"], str(r.get("grid")))
        rows.setdefault(key, {}).setdefault(tree, []).append(round(r["ms"] * 1e3, 2))
for key, trees in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][3], kv[0][0])):
    print(*key, json.dumps(trees))
