"""The grids (CTAs per (sequence, KV head, head group) row, per launch) that a format by
age's decode launches at the decode table's rows, per ``tiered_merge`` mode, worked out on
the CPU (simulator) with the H200's 132 SMs and ptxas's occupancy: the thirty-third
session's ``2026-12-04-s33/grids.py`` (its output's form and its occupancy figures) with
"packed" (thirty-sixth session) and two more rows (B=128 2k, B=32 1k):

    NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=. python benchmarks/experiments/2026-12-05-packed/grids.py
"""
import importlib.util
import os

from hexcore.cuda import DecodeOptions

_path = os.path.join(os.path.dirname(__file__), "..", "2026-12-04-s33", "grids.py")
_spec = importlib.util.spec_from_file_location("grids_s33", _path)
grids_s33 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grids_s33)  # (patches the launcher's SM count and occupancy, as there)
grids_s33.MODES["packed"] = DecodeOptions(tiered_merge="packed")
ROWS = grids_s33.ROWS + ((128, 2048), (32, 1024))

if __name__ == "__main__":
    for name in ("int4-aged", "int2-aged"):
        for batch, ctx in ROWS:
            print(grids_s33.grids(name, batch, ctx), flush=True)
