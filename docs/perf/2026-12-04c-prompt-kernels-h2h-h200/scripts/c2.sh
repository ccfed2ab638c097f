#!/usr/bin/env bash
# Call 2: the new GEMM and flash kernels (GPU tests, old vs new benches, bits), the profile path's TTFT probe, profile 8k/32k.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
HEAD_SHA=$(cat .devrun/head.sha)
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/pip.log 2>&1
if [ ! -d /tmp/llsite/llama_cpp ]; then
mkdir -p /tmp/ll && tar xzf .whl/llama_cpp_python-0.3.36-src.tgz -C /tmp/ll
(CMAKE_ARGS="-DLLAVA_BUILD=OFF" python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/llsite /tmp/ll/llama_cpp_python-0.3.36 > $R/llama_build.log 2>&1) &
fi
export PYTHONPATH=/tmp/site:/tmp/llsite
mkdir -p /root/m
cd .devrun/head
[ -f /root/m/seed8.gguf ] || (python3 -m runner.cli synth /root/m/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 12 > $R/synth.log 2>&1; echo "synth done at $(( $(date +%s) - T0 )) s") &
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gemm_cuda.py tests/test_moe_prefill_cuda.py tests/test_flash_attention_cuda.py tests/test_flash_attention_build.py tests/test_moe_prefill_tiles.py > $R/kernel_tests.log 2>&1
echo "kernel tests rc=$? at $(( $(date +%s) - T0 )) s"; tail -3 $R/kernel_tests.log
timeout 120 python3 -m scripts.bench.bench_moe_prefill_cuda --against ../old_moe_prefill.cu --repeat 10 --commit $HEAD_SHA --out $R/moe_prefill_bench.json > $R/moe_prefill_bench.log 2>&1
echo "moe bench rc=$? at $(( $(date +%s) - T0 )) s"; tail -30 $R/moe_prefill_bench.log
timeout 100 python3 -m scripts.bench.bench_attention_cuda --prefill-only --shape seed --repeat 20 --flash-f16-keys 64,32 --against ../old_flash_attention.cu --commit $HEAD_SHA --out $R/attn_bench.json > $R/attn_bench.log 2>&1
echo "attn bench rc=$? at $(( $(date +%s) - T0 )) s"; tail -30 $R/attn_bench.log
wait
P="--prompt-file README.md --gen 16 --profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none"
for i in 1 2; do
  timeout 120 python3 ../ttft_probe.py $R/ttft_p$i.json profile /root/m/seed8.gguf $P --prompt-tokens 8192 --json $R/prof8k_p$i.json > $R/ttft_p$i.log 2>&1
  echo "probe $i rc=$? at $(( $(date +%s) - T0 )) s"; grep PROBE $R/ttft_p$i.log
done
timeout 100 python3 -m runner.cli profile /root/m/seed8.gguf $P --prompt-tokens 32768 --json $R/prof32k.json > $R/prof32k.log 2>&1
echo "32k rc=$? at $(( $(date +%s) - T0 )) s"; grep -i "ttft\|time to first\|kernel\|upload" $R/prof32k.log | head
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_offload_cuda.py tests/test_nextn_graph_cuda.py tests/test_grid_types_cuda.py > $R/gpu_tests2.log 2>&1
echo "tests2 rc=$? at $(( $(date +%s) - T0 )) s"; tail -3 $R/gpu_tests2.log
cd $OUT && tar czf r.tgz r && rm -rf r
