#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
export PYTHONPATH=/tmp/site:/tmp/llsite
mkdir -p /tmp/lc; [ -x /tmp/lc/pkg/bin/llama-bench ] || tar -xJf .llcuda/llama-cuda-sm90.tar.xz -C /tmp/lc
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64
timeout 330 python3 -m pytest -q -p no:cacheprovider -rf $(grep -l "mark.cuda" tests/*.py) > $R/gpu_suite.log 2>&1
echo "suite rc=$? at $(( $(date +%s) - T0 )) s"; tail -12 $R/gpu_suite.log | grep -v "^$"
OURS="staging=--profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none --warm-fill staging"
LEFT=$(( 585 - ($(date +%s) - T0) ))
timeout $LEFT python3 -m scripts.bench.h2h_llama /root/m/seed48.gguf --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 --llama-extra "-fa 1 -lm none -t 16" --rounds 3 --repeats 2 \
  --prompt-tokens 8192 --gen 16 --styles ot-exps-cpu --pp-only --prompt-file README.md --ours "$OURS" --out $R/h2h_seed48_8k.json > $R/h2h_8k.log 2>&1
echo "h2h 8k rc=$? at $(( $(date +%s) - T0 )) s"; tail -8 $R/h2h_8k.log
cd $OUT && tar czf r.tgz r && rm -rf r
