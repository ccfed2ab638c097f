#!/usr/bin/env bash
# Call H: the two re-written GPU tests; head-to-head with llama.cpp on seed8 at 8k (full), 32k and 2k (prompt processing).
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
HEAD_SHA=$(cat .dr/head.sha)
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/pip.log 2>&1
export PYTHONPATH=/tmp/site:/tmp/llsite
mkdir -p /root/m /tmp/lc; [ -x /tmp/lc/pkg/bin/llama-bench ] || tar -xJf .llcuda/llama-cuda-sm90.tar.xz -C /tmp/lc
if [ ! -d /tmp/llsite/llama_cpp ]; then mkdir -p /tmp/ll && tar xzf .whl/llama_cpp_python-0.3.36-src.tgz -C /tmp/ll; CMAKE_ARGS="-DLLAVA_BUILD=OFF" python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/llsite /tmp/ll/llama_cpp_python-0.3.36 > $R/llama_build.log 2>&1 & fi
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64
:
[ -f /root/m/seed8.gguf ] || (python3 -m runner.cli synth /root/m/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 12 > $R/synth.log 2>&1) &
wait
echo "setup at $(( $(date +%s) - T0 )) s"
PLAIN="plain=--profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none"
wait; timeout 290 python3 -m scripts.bench.h2h_llama /root/m/seed8.gguf --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 --llama-extra "-fa 1 -lm none -t 16" --rounds 5 \
  --prompt-tokens 8192 --gen 128 --ours "$PLAIN" --ours "mtp=--profile home-24g" --out $R/h2h_seed8_8k.json > $R/h2h_8k.log 2>&1
echo "h2h 8k rc=$? at $(( $(date +%s) - T0 )) s"; tail -12 $R/h2h_8k.log
LEFT=$(( 440 - ($(date +%s) - T0) ))
[ $LEFT -gt 40 ] && { timeout $LEFT python3 -m scripts.bench.h2h_llama /root/m/seed8.gguf --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 --llama-extra "-fa 1 -lm none -t 16" --rounds 5 \
  --prompt-tokens 32768 --gen 4 --styles ot-exps-cpu --pp-only --ours "$PLAIN" --out $R/h2h_seed8_32k.json > $R/h2h_32k.log 2>&1; echo "h2h 32k rc=$? at $(( $(date +%s) - T0 )) s"; tail -6 $R/h2h_32k.log; }
LEFT=$(( 440 - ($(date +%s) - T0) ))
[ $LEFT -gt 40 ] && { timeout $LEFT python3 -m scripts.bench.h2h_llama /root/m/seed8.gguf --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 --llama-extra "-fa 1 -lm none -t 16" --rounds 5 \
  --prompt-tokens 2048 --gen 4 --styles ot-exps-cpu --pp-only --ours "$PLAIN" --out $R/h2h_seed8_2k.json > $R/h2h_2k.log 2>&1; echo "h2h 2k rc=$? at $(( $(date +%s) - T0 )) s"; tail -6 $R/h2h_2k.log; }
cd $OUT && tar czf r.tgz r && rm -rf r
