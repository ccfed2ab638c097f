#!/usr/bin/env bash
# Head-to-head on seed8 at 8k: llama.cpp (CUDA, experts on the CPU, ub 2048) against runner profile at plain decode and the home-24g profile (adaptive MTP).
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
export PYTHONPATH=/tmp/site:/tmp/llsite
ls /tmp/site/gguf /tmp/llsite/llama_cpp /root/m/seed8.gguf > /dev/null || { echo "warm state lost"; exit 3; }
mkdir -p /tmp/lc && tar -xJf .llcuda/llama-cuda-sm90.tar.xz -C /tmp/lc
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64
/tmp/lc/pkg/bin/llama-bench --help 2>&1 | head -3 > $R/llama_help.txt
echo "setup at $(( $(date +%s) - T0 )) s"
cd .devrun/head
timeout 540 python3 -m scripts.bench.h2h_llama /root/m/seed8.gguf --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 \
  --prompt-tokens 8192 --gen 128 --rounds 5 --llama-extra "-fa 1 -lm none -t 16" \
  --ours "plain=--profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none" --ours "mtp=--profile home-24g" --out $R/h2h_seed8_8k.json > $R/h2h.log 2>&1
echo "h2h rc=$? at $(( $(date +%s) - T0 )) s"; tail -20 $R/h2h.log
cd $OUT && tar czf r.tgz r && rm -rf r
