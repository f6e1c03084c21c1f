# s24 call 2: the GPU tests (-n 8) beside the four sanitizers, on the tree with
# DecodeOptions.dependent_launch and the one-wave split for the uncapped kernel
source .gpurun/env.sh
rm -rf $R/*; git log --oneline -1 > $R/head.txt; git status --short >> $R/head.txt
mkdir -p $R/tests $R/san
(OUT=$R/san HEXCORE_GPU_CHECK=sanitize timeout 400 scripts/gpu-check > $R/san.log 2>&1; echo "sanitize rc $?" >> $R/san.log) &
OUT=$R/tests HEXCORE_GPU_CHECK=tests timeout 480 scripts/gpu-check -n 8 > $R/tests.log 2>&1
echo "tests rc $?"
wait
tail -4 $R/tests.log; tail -6 $R/san.log
grep -v -E "^PASSED|^SKIPPED" $R/tests/gpu-tests-outcomes.txt | head -20
cp -r $R/* $OUT/ 2>/dev/null
