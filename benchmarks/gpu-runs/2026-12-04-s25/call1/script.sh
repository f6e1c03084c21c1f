# s25 call 1: the whole GPU suite (-n 8) beside the four sanitizers on main (owed from s24:
# dependent launches on by default), and beside them a patched copy (both s24 experiments)
# running its dependent and persistent GPU tests
source .gpurun/env.sh
rm -rf $R/*; git log --oneline -1 > $R/head.txt; git status --short >> $R/head.txt
mkdir -p $R/tests $R/san
wheels=$(cd .whl && sha256sum *.whl); printf '%s' "$wheels" > /tmp/hexcore-site/.hexcore-wheels  # gpu-check: no reinstall under the patched run
(OUT=$R/san HEXCORE_GPU_CHECK=sanitize timeout 420 scripts/gpu-check > $R/san.log 2>&1; echo "sanitize rc $?" >> $R/san.log) &
( rm -rf /tmp/p; cp -r . /tmp/p; cd /tmp/p && git apply benchmarks/experiments/2026-12-04-persistent-pdl/persistent-pdl.diff benchmarks/experiments/2026-12-04-trigger-before-merge/trigger-before-merge.diff && git status --short > $R/patched-status.txt
  cd /tmp/p && PYTHONPATH=/tmp/hexcore-site:/tmp/p timeout 420 python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests/cuda/attention/test_persistent.py tests/cuda/attention/test_decode.py tests/cuda/steps/test_graph.py -k "persistent or dependent" > $R/patched-tests.log 2>&1; echo "patched rc $?" >> $R/patched-tests.log ) &
OUT=$R/tests HEXCORE_GPU_CHECK=tests timeout 480 scripts/gpu-check -n 8 > $R/tests.log 2>&1
echo "tests rc $?"
wait
tail -4 $R/tests.log; tail -6 $R/san.log; tail -4 $R/patched-tests.log
grep -v -E "^PASSED|^SKIPPED" $R/tests/gpu-tests-outcomes.txt | head -20
cp -r $R/* $OUT/ 2>/dev/null
