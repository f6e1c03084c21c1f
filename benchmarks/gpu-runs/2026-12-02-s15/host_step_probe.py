"""Per-step host ms of an int2-aged step (kept views, or --fresh), then cProfile of 20 more steps."""
import cProfile, pstats, sys, time
from numba import cuda
from hexcore.cuda import views
from benchmarks.host_step import make_engine

views.KEEP = "--fresh" not in sys.argv
engine, seqs = make_engine("int2-aged", 4, 63, 600)
per = []
for i in range(40):
    t = time.perf_counter()
    engine.step(seqs).run()
    cuda.synchronize()
    per.append(1e3 * (time.perf_counter() - t))
print("keep" if views.KEEP else "fresh", "per-step ms (synchronised each):", " ".join(f"{x:.1f}" for x in per))
prof = cProfile.Profile(); prof.enable()
for _ in range(20):
    engine.step(seqs).run()
cuda.synchronize(); prof.disable()
st = pstats.Stats(prof); st.sort_stats("cumulative").print_stats(35); st.sort_stats("tottime").print_stats(20)
