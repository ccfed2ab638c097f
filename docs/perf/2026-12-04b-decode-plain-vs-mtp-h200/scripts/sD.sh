#!/usr/bin/env bash
# decode attention: DEC_SLOTS sweep (4, 2, 1) at KV_CHUNK 256 and 128 on the seed and air shapes; the attention GPU tests.
set -u
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/pip.log 2>&1
export PYTHONPATH=/tmp/site
cd .devrun/head
for s in seed air; do
timeout 150 python3 -m scripts.bench.bench_attention_cuda --shape $s --decode-only --repeat 20 --kv-chunks 256,128 --dec-slots 4,2,1 --out $R/attn_slots_$s.json > $R/attn_slots_$s.log 2>&1; echo "$s rc=$? at $(( $(date +%s) - T0 )) s"
done
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_attention_cuda.py -k "pairs_per_warp or batch_invariant" > $R/attn_tests.log 2>&1; echo "tests rc=$? at $(( $(date +%s) - T0 )) s"; tail -3 $R/attn_tests.log
cd $OUT && tar czf r.tgz r && rm -rf r
