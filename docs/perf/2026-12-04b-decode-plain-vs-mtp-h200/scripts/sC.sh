#!/usr/bin/env bash
# decode attention: KV_CHUNK sweep on the seed and air shapes (which chunk keeps a one-warp-per-block shape busy)
set -u
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/pip.log 2>&1
export PYTHONPATH=/tmp/site
cd .devrun/head
for s in seed air; do
timeout 200 python3 -m scripts.bench.bench_attention_cuda --shape $s --decode-only --repeat 20 --kv-chunks 32,64,128,256 --out $R/attn_sweep_$s.json > $R/attn_sweep_$s.log 2>&1; echo "$s rc=$? at $(( $(date +%s) - T0 )) s"
done
cd $OUT && tar czf r.tgz r && rm -rf r
