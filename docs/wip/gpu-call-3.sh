#!/usr/bin/env bash
# Decode A/B of issue 20's directory graphs (docs/wip/README.md, decode-graphs), on a warm box right after
# gpu-call-1.sh (it reuses /tmp/site, /tmp/llsite, /root/m/seed8.gguf), from a working tree at main.
# 1. decode-graphs.patch's GPU tests (stop if they fail); 2. head-to-head on seed8 (8 layers, 150 slots, 24 GiB),
# prompt 1024 then 128 generated tokens, 3 rounds: llama.cpp (-ot exps=CPU), ours with segments, ours with
# directory graphs, and directory graphs under the qwen3-30b-a3b locality routing (labelled: synthetic ids);
# 3. kernel launches per decode token under nsys (node-level graph trace) for segments and directory.
#   run: bash docs/wip/gpu-call-3.sh        carry: [".llcuda"]
source docs/wip/device-env.sh
mkdir -p /tmp/lc; [ -x /tmp/lc/pkg/bin/llama-bench ] || tar -xJf .llcuda/llama-cuda-sm90.tar.xz -C /tmp/lc
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64
git apply docs/wip/decode-graphs.patch || { echo "cannot apply decode-graphs"; exit 1; }
timeout 240 python3 -m pytest -q -p no:cacheprovider -rf tests/test_slot_directory_cuda.py \
  tests/test_graph_survival_cuda.py tests/test_decode_segments_cuda.py > $R/token_graph_tests.log 2>&1
RC=$?; at "token graph GPU tests rc=$RC"; tail -8 $R/token_graph_tests.log
S="--profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none --warm-fill staging"
if [ $RC -eq 0 ]; then
  LEFT=$(( 470 - ($(date +%s) - T0) ))
  timeout $LEFT python3 -m scripts.bench.h2h_llama /root/m/seed8.gguf --llama-bench /tmp/lc/pkg/bin/llama-bench \
    --ubatch 2048 --llama-extra "-fa 1 -lm none -t 16" --rounds 3 --prompt-tokens 1024 --gen 128 --styles ot-exps-cpu \
    --prompt-file README.md --ours "segments=$S" --ours "directory=$S --decode-graph directory" \
    --ours "directory-locality=$S --decode-graph directory --routing locality-qwen3-30b-a3b" \
    --keep-reports $R/reports --out $R/h2h_seed8_decode.json > $R/h2h_decode.log 2>&1
  at "h2h decode rc=$?"; tail -12 $R/h2h_decode.log
fi
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys 2>/dev/null | head -1)
for kind in segments directory; do  # launches per decode token: (kernels at 96 tokens - at 32) / 64
  for gen in 32 96; do
    LEFT=$(( 580 - ($(date +%s) - T0) )); { [ $LEFT -lt 40 ] || [ -z "$NSYS" ]; } && break 2
    timeout $LEFT $NSYS profile -o /tmp/nsys_${kind}_$gen --cuda-graph-trace=node --force-overwrite true \
      python3 -m runner.cli profile /root/m/seed8.gguf --prompt-file README.md --prompt-tokens 256 --gen $gen $S \
      --decode-graph $kind > $R/nsys_${kind}_$gen.log 2>&1
    $NSYS stats -q --report cuda_gpu_kern_sum --format csv /tmp/nsys_${kind}_$gen.nsys-rep > $R/kern_${kind}_$gen.csv 2>&1
    at "nsys $kind gen $gen rc=$?"
  done
done
python3 - $R <<'PY'
import csv, glob, sys
def launches(path):
    rows = [r for r in csv.DictReader(l for l in open(path) if "," in l)]
    return sum(int(r.get("Instances", r.get("Count", 0)) or 0) for r in rows)
for kind in ("segments", "directory"):
    try:
        a, b = (launches(f"{sys.argv[1]}/kern_{kind}_{g}.csv") for g in (32, 96))
        print(kind, "kernels per decode token", (b - a) / 64)
    except (OSError, ValueError) as e:
        print(kind, "no count:", e)
PY
git apply -R docs/wip/decode-graphs.patch
cd $OUT && tar czf r.tgz r && rm -rf r
