#!/usr/bin/env bash
# Call 1: setup; the whole GPU suite (warm fill and DeltaNet branches merged); seed48 synthesized beside it;
# then the warm fill A/B on seed48 at 8k (host vs staging, alternating, --warmup 1 --repeat 2).
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/pip.log 2>&1
mkdir -p /tmp/ll && tar xzf .whl/llama_cpp_python-0.3.36-src.tgz -C /tmp/ll
(CMAKE_ARGS="-DLLAVA_BUILD=OFF" python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/llsite /tmp/ll/llama_cpp_python-0.3.36 > $R/llama_build.log 2>&1; echo "llama build rc=$? at $(( $(date +%s) - T0 )) s") &
export PYTHONPATH=/tmp/site:/tmp/llsite
mkdir -p /root/m
(python3 -m runner.cli synth /root/m/seed48.gguf --arch glm4moe --preset seed --quant Q4_K_M --jobs 10 > $R/synth48.log 2>&1; echo "synth48 rc=$? at $(( $(date +%s) - T0 )) s") &
nvidia-smi > $R/nvidia-smi.txt 2>&1
timeout 360 python3 -m pytest -q -p no:cacheprovider -rf $(grep -l "mark.cuda" tests/*.py) > $R/gpu_suite.log 2>&1
echo "suite rc=$? at $(( $(date +%s) - T0 )) s"; tail -15 $R/gpu_suite.log | grep -v "^$"
wait
df -h /root | tail -1
P8="--prompt-file README.md --prompt-tokens 8192 --gen 16 --warmup 1 --repeat 2 --profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none"
for i in 1 2 3; do
  for fill in staging host; do
    LEFT=$(( 575 - ($(date +%s) - T0) )); [ $LEFT -lt 60 ] && break 2
    timeout $LEFT python3 -m runner.cli profile /root/m/seed48.gguf $P8 --warm-fill $fill --json $R/wf48_${fill}_$i.json > $R/wf48_${fill}_$i.log 2>&1
    echo "wf $fill $i rc=$? at $(( $(date +%s) - T0 )) s"
    python3 - $R/wf48_${fill}_$i.json <<'PY' || tail -3 $R/wf48_${fill}_$i.log
import json, sys
r = json.load(open(sys.argv[1])); p = r["prefill"]
print(" ", [(round(x["ttft_s"], 3), x["restore_s"] and round(x["restore_s"], 3), x["warm_bytes"], x["warm_device_bytes"]) for x in r["runs"]],
      "warm_fill", p["warm_fill"], "load_s", r.get("load_s"))
PY
  done
done
cd $OUT && tar czf r.tgz r && rm -rf r
