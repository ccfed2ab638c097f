#!/usr/bin/env bash
# GPU suite on the working tree (after the removals and renames), with seed8 synthesized beside it for the A/B call.
set -u
export PYTHONUNBUFFERED=1
mkdir -p /root/m
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $OUT/pip0.log 2>&1
[ -f /root/m/seed8.gguf ] || (cd .devrun/head && PYTHONPATH=/tmp/site timeout 400 python3 -m runner.cli synth /root/m/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 8 > $OUT/synth.log 2>&1; echo "synth rc=$?" >> $OUT/synth.log) &
bash .devrun/gpu_suite.sh
wait; tail -2 $OUT/synth.log; ls -la /root/m
