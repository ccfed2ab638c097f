#!/usr/bin/env bash
# Issue 19 probe: an 8k layer-major prefill on seed8, GPU time per op (prefill_breakdown.py).
set -u
export PYTHONUNBUFFERED=1
mkdir -p /root/m
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
if [ ! -d /tmp/llsite/llama_cpp ]; then
  mkdir -p /tmp/ll && tar xzf .whl/llama_cpp_python-0.3.36-src.tgz -C /tmp/ll
  CMAKE_ARGS="-DLLAVA_BUILD=OFF" python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/llsite /tmp/ll/llama_cpp_python-0.3.36 > $OUT/llama_build.log 2>&1 &
fi
[ -f /root/m/seed8.gguf ] || (cd .devrun/head && PYTHONPATH=/tmp/site timeout 300 python3 -m runner.cli synth /root/m/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 12 > $OUT/synth.log 2>&1)
wait
cp .devrun/prefill_breakdown.py .devrun/head/
cd .devrun/head && PYTHONPATH=/tmp/site:/tmp/llsite timeout 200 python3 prefill_breakdown.py /root/m/seed8.gguf --out $OUT/prefill_breakdown.json
