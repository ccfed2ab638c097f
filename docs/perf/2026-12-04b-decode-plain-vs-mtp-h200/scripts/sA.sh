#!/usr/bin/env bash
# setup only: site packages, llama-cpp-python, seed8; then a kernel-compiling warm-up process.
set -u
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
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
timeout 90 python3 -m runner.cli profile /root/m/seed8.gguf --prompt-file README.md --prompt-tokens 1024 --gen 16 --profile home-24g > $R/warm.log 2>&1
echo "setup done at $(( $(date +%s) - T0 )) s"; tail -2 $R/warm.log
cd $OUT && tar czf r.tgz r && rm -rf r
