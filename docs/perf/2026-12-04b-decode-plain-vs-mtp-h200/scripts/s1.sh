#!/usr/bin/env bash
# Session 2026-12-04b call 1: setup; decode at depth 1k/8k (where does depth cost go); decode attention alone; CUDA suite.
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
[ -f /root/m/seed8.gguf ] || python3 -m runner.cli synth /root/m/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 12 > $R/synth.log 2>&1
wait
echo "setup done at $(( $(date +%s) - T0 )) s"
timeout 120 python3 -m scripts.bench.bench_attention_cuda --shape seed --decode-only --out $R/attn_seed.json > $R/attn_seed.log 2>&1; echo "attn rc=$? at $(( $(date +%s) - T0 )) s"
for i in 1 2; do
timeout 120 python3 -m scripts.bench.bench_offload decode /root/m/seed8.gguf --slots 150 --contexts 1024,8192 --tokens 64 --runs 2 --commit $HEAD_SHA --out $R/decode_depth_p$i.json > $R/decode_depth_p$i.log 2>&1; echo "decode p$i rc=$? at $(( $(date +%s) - T0 )) s"
done
timeout $(( 585 - $(date +%s) + T0 )) python3 -m pytest -q -p no:cacheprovider $(grep -l "mark.cuda" tests/*.py) > $R/gpu_tests.log 2>&1; echo "suite rc=$? at $(( $(date +%s) - T0 )) s"
tail -5 $R/gpu_tests.log
cd $OUT && tar czf r.tgz r && rm -rf r
