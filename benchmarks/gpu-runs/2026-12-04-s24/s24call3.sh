# s24 call 3: the decode table queued with its peers (the one-wave uncapped split in), then B=1 with and
# without dependent launches, twice
source .gpurun/env.sh
rm -rf $R/*; git log --oneline -1 > $R/head.txt; git status --short >> $R/head.txt
OUT=$R timeout 260 python3 -m benchmarks.bench_decode --shapes all --flex 2 --queued --name table24 > $R/table.log 2>&1
for i in 1 2; do OUT=$R timeout 80 python3 -m benchmarks.bench_decode --shapes "1,32,8,1024;1,32,8,32768" --variants --variant-names "default,dependent launch" --flex none --no-peers --queued --name pdl$i > $R/pdl$i.log 2>&1; done
cp -r $R/* $OUT/ 2>/dev/null
for f in table pdl1 pdl2; do echo "== $f"; grep -E "^(hexcore|torch|Flex)" $R/$f.log | cut -d'|' -f1-2,5-10,15; done
