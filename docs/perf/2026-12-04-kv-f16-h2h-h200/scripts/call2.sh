#!/usr/bin/env bash
# CUDA suite at HEAD; runner profile 32k with f16 against f32 K/V (alternating, 3 processes each);
# decode on seed8 at 150 slots under each routing mode.
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
for i in 1 2 3; do for t in f16 f32; do
  timeout 60 python3 -m runner.cli profile /root/m/seed8.gguf --prompt-file README.md --prompt-tokens 32768 --gen 8 --cache-type $t --json $R/profile32k_${t}_p$i.json > $R/profile32k_${t}_p$i.log 2>&1; echo "profile $t p$i rc=$? at $(( $(date +%s) - T0 )) s"
done; done
for r in random uniform locality-qwen3-30b-a3b locality-demo; do
  timeout 60 python3 -m scripts.bench.bench_offload decode /root/m/seed8.gguf --slots 150 --contexts 1024 --tokens 64 --runs 2 --routing $r --commit $HEAD_SHA --out $R/decode150_$r.json > $R/decode150_$r.log 2>&1; echo "decode $r rc=$? at $(( $(date +%s) - T0 )) s"
done

timeout $(( 580 - $(date +%s) + T0 )) python3 -m pytest -q -p no:cacheprovider tests/test_grid_types_cuda.py tests/test_ops_cuda.py > $R/gpu_tests.log 2>&1; echo "suite rc=$? at $(( $(date +%s) - T0 )) s"
tail -25 $R/gpu_tests.log
cd $OUT && tar czf r.tgz r && rm -rf r
