#!/usr/bin/env bash
# Call 1: setup; the draft-graph landing's GPU tests; TTFT of the profile path (3 requests per process); bench_mtp demo resident.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
HEAD_SHA=$(cat .devrun/head.sha)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/pip.log 2>&1
mkdir -p /tmp/ll && tar xzf .whl/llama_cpp_python-0.3.36-src.tgz -C /tmp/ll
(CMAKE_ARGS="-DLLAVA_BUILD=OFF" python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/llsite /tmp/ll/llama_cpp_python-0.3.36 > $R/llama_build.log 2>&1) &
export PYTHONPATH=/tmp/site:/tmp/llsite
mkdir -p /root/m
cd .devrun/head
python3 -m runner.cli synth /root/m/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 12 > $R/synth.log 2>&1
echo "synth at $(( $(date +%s) - T0 )) s"
P8="--prompt-file README.md --prompt-tokens 8192 --gen 16 --profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none"
for i in 1 2; do
  timeout 120 python3 ../ttft_probe.py $R/ttft_p$i.json profile /root/m/seed8.gguf $P8 --json $R/prof8k_p$i.json > $R/ttft_p$i.log 2>&1
  echo "probe $i rc=$? at $(( $(date +%s) - T0 )) s"; grep PROBE $R/ttft_p$i.log
done
wait
echo "llama build done at $(( $(date +%s) - T0 )) s"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_nextn_graph_cuda.py tests/test_decode_segments_cuda.py tests/test_engine_cuda.py > $R/gpu_tests.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - T0 )) s"; tail -3 $R/gpu_tests.log
timeout 150 python3 -m scripts.bench.bench_mtp runner/data/demo.gguf --slots resident --context 512 --runs 3 --tokens 64 --commit $HEAD_SHA --out $R/mtp_demo_resident.json > $R/mtp_demo_resident.log 2>&1
echo "mtp rc=$? at $(( $(date +%s) - T0 )) s"; tail -25 $R/mtp_demo_resident.log
cd $OUT && tar czf r.tgz r && rm -rf r
