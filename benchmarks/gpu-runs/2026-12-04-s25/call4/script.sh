# s25 call 4: persistent slices as dependent launches (the persistent-pdl experiment applied):
# every persistent GPU test (-n 8) beside memcheck and racecheck of the sanitize script's new kernels
source .gpurun/env.sh
rm -rf $R/*; git log --oneline -1 > $R/head.txt; git status --short >> $R/head.txt
(timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 python3 -m benchmarks.sanitize --new > $R/memcheck.log 2>&1; echo "memcheck rc $?" >> $R/memcheck.log) &
(timeout 250 compute-sanitizer --tool racecheck --error-exitcode 1 python3 -m benchmarks.sanitize --new > $R/racecheck.log 2>&1; echo "racecheck rc $?" >> $R/racecheck.log) &
timeout 250 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 8 tests/cuda/attention/test_persistent.py > $R/ptests.log 2>&1; echo "ptests rc $?"
wait
tail -2 $R/ptests.log; tail -3 $R/memcheck.log $R/racecheck.log
cp -r $R/* $OUT/ 2>/dev/null
