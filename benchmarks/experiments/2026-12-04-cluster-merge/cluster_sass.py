"""Compile the cluster-merge decode kernel beside the plain one (cap 128 and uncapped 255) to
PTX and cubin on a CPU: registers, spills, and the cluster instructions in the PTX. With
cluster-merge.diff applied, from the repository root:

    PYTHONPATH=. python benchmarks/experiments/2026-12-04-cluster-merge/cluster_sass.py [OUT]

Needs numba-cuda's NVVM and ptxas on PATH (as ``benchmarks.ptx_report``); the PTX's version
line is lowered to the one ptxas 13.0 knows."""
import os, re, subprocess, sys, tempfile, types as pytypes
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
import numba.cuda.dispatcher as _dispatcher
from numba import cuda
_dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(9, 0))
from benchmarks.ptx_report import DECODE_SIG
from hexcore.cuda.attention.kernel import decode_kernel
from hexcore.cuda.attention.shape import DecodeShape
out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
os.makedirs(out, exist_ok=True)
for bits, D, BS, G in [(16, 128, 32, 4), (4, 128, 32, 4), (2, 128, 32, 4), (16, 128, 32, 8), (2, 64, 16, 1)]:
    shape = DecodeShape(bits, 8, D, BS, G, 64 if D >= 64 else D)
    for cap in (128, 255):
        for cluster in (False, True):
            k = decode_kernel(shape, cap, dependent=True, cluster=cluster).py_func
            ptx, _ = cuda.compile_ptx(k, DECODE_SIG, cc=(9, 0))
            name = f"{bits}-{D}-{BS}-{G}-{cap}-{'cluster' if cluster else 'plain'}"
            open(f"{out}/{name}.ptx", "w").write(re.sub(r"^\.version .*$", ".version 9.0", ptx, flags=re.MULTILINE))
            r = subprocess.run(["ptxas", "-arch=sm_90", "-O3", "-v", f"-maxrregcount={cap}", f"{out}/{name}.ptx", "-o", f"{out}/{name}.cubin"],
                               capture_output=True, text=True)
            info = " ".join(l.strip() for l in r.stderr.splitlines() if "registers" in l or "spill" in l)
            regs = re.search(r"Used (\d+) registers", r.stderr)
            spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
            n = {op: ptx.count(op) for op in ("barrier.cluster", "mapa", "atom.acq_rel")}
            print(name, "regs", regs and regs.group(1), "spill", spill and spill.groups(), n, r.returncode, r.stderr[-300:] if r.returncode else "")
