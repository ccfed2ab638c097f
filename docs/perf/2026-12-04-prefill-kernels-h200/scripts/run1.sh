#!/usr/bin/env bash
# Call 1 (issue 19): the new kernels' GPU tests, attention bench, prefill A/B 8117adc vs HEAD on seed8.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1 || { tail -5 $OUT/pip.log; exit 1; }
export PYTHONPATH=/tmp/site
mkdir -p /root/m
(cd .devrun/head && python3 -m runner.cli synth /root/m/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 12 > $OUT/synth.log 2>&1; echo "synth rc=$? at $(( $(date +%s) - T0 )) s" >> $OUT/synth.log) &
SYN=$!
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"; } > $OUT/env.txt 2>&1
cd .devrun/head
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_gemm_cuda.py tests/test_moe_prefill_cuda.py tests/test_flash_attention_cuda.py > $OUT/tests_new.log 2>&1; echo "new kernel tests rc=$? at $(( $(date +%s) - T0 )) s"
tail -15 $OUT/tests_new.log
timeout 120 python3 -m scripts.bench.bench_attention_cuda --prefill-only --shape seed --repeat 10 --out $OUT/attention_seed.json > $OUT/attention.log 2>&1; echo "attn bench rc=$?"
grep -o '"precision": "[a-z0-9]*", "kv_dtype": "[a-z0-9]*", "T": [0-9]*, "n_kv": [0-9]*\|"TFLOPs": [0-9.]*' $OUT/attention.log | paste - - | head -20
wait $SYN; cat $OUT/synth.log | tail -2
cd ..
for arm in head old; do
  (cd $arm && timeout 150 python3 -m scripts.bench.bench_offload prefill /root/m/seed8.gguf --order layer_major --ubatch 2048 --lengths 8192,32768 --runs 2 --slots 150 --out $OUT/prefill_${arm}.json > $OUT/prefill_${arm}.log 2>&1; echo "prefill $arm rc=$? at $(( $(date +%s) - T0 )) s")
  grep -o '"ttft_s": {[^}]*}' $OUT/prefill_${arm}.json 2>/dev/null | head -4
done
cd head
timeout $(( 560 - $(date +%s) + T0 )) python3 -m pytest -q -p no:cacheprovider tests/test_offload_cuda.py tests/test_attention_cuda.py tests/test_ops_cuda.py tests/test_engine_cuda.py > $OUT/tests_more.log 2>&1; echo "more tests rc=$? at $(( $(date +%s) - T0 )) s"
tail -15 $OUT/tests_more.log
