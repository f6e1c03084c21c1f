# s26 call A: the whole GPU suite (-n 8) beside the four sanitizers, on main with the cluster
# merge on by default (fill <= 0.5) and the quantized early reads
source .gpurun/env.sh
rm -rf $R/*; git log --oneline -1 > $R/head.txt; git status --short >> $R/head.txt
mkdir -p $R/tests $R/san
wheels=$(cd .whl && sha256sum *.whl); printf '%s' "$wheels" > /tmp/hexcore-site/.hexcore-wheels
(OUT=$R/san HEXCORE_GPU_CHECK=sanitize timeout 430 scripts/gpu-check > $R/san.log 2>&1; echo "sanitize rc $?" >> $R/san.log) &
OUT=$R/tests HEXCORE_GPU_CHECK=tests timeout 440 scripts/gpu-check -n 8 > $R/tests.log 2>&1
echo "tests rc $?"
wait
tail -3 $R/tests.log; tail -7 $R/san.log
grep -v -E "^PASSED|^SKIPPED" $R/tests/gpu-tests-outcomes.txt | head -20
grep -E "^(FAILED|ERROR)" $R/tests.log | head -20
rm -rf $R/tests/*.xml 2>/dev/null
cp -r $R/* $OUT/ 2>/dev/null
