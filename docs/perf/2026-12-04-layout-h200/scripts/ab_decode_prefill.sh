#!/usr/bin/env bash
# Same-call A/B of the layout change: 20e98ef (.devrun/old) against HEAD (.devrun/head), one process per arm
# and kind, alternated (MEASURING.md 3-5), on seed8 (the seed shape, 8 layers, Q4_K_M) at 24 GiB.
set -u
export PYTHONUNBUFFERED=1
M=/root/m/seed8.gguf
[ -f $M ] || { echo "no $M"; exit 1; }
BASE=/tmp/site:/tmp/llsite
R=$OUT/ab; mkdir -p $R
old() { (cd .devrun/old && PYTHONPATH=$BASE:$PWD timeout 150 python3 scripts/bench_offload.py "$@" --commit 20e98ef); }
new() { (cd .devrun/head && PYTHONPATH=$BASE timeout 150 python3 -m scripts.bench.bench_offload "$@" --commit $(cat ../head.sha)); }
for i in 1 2 3; do
  for arm in old new; do
    $arm decode $M --slots 150 --contexts 1024 --tokens 48 --runs 3 --out $R/decode_${arm}_p$i.json > $R/decode_${arm}_p$i.log 2>&1
    echo "decode $arm p$i rc=$?"
  done
done
for i in 1 2; do
  for arm in old new; do
    $arm prefill $M --order layer_major --ubatch 2048 --lengths 8192 --runs 3 --out $R/prefill_${arm}_p$i.json > $R/prefill_${arm}_p$i.log 2>&1
    echo "prefill $arm p$i rc=$?"
  done
done
cd $OUT && tar czf ab.tgz ab && rm -rf ab
