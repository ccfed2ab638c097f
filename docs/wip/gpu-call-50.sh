#!/usr/bin/env bash
# Issue 20 (2026-12-08): resident seed48 against llama.cpp with every weight on the GPU too (h2h_llama --styles
# resident: -ngl 99, no -ot), decode at 1k, fresh processes: the kernels alone, no link. The resident target
# (400 tok/s) has had no llama.cpp figure beside it; this says how far both are from the weights' HBM floor. Arms:
# main, and on gpu-call-46's warm box the stack of its screen's winners (decode_arms46.json, as 46b picks them).
#   run: bash docs/wip/gpu-call-50.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
wait
at "synth"
STACK=$(screened_stack)
echo "stack:$STACK" > $R/stack.txt
RESIDENT="--profile none --no-offload -ub 512 --draft none"
ARMS=(--ours "main=$RESIDENT")
DECODE=$RESIDENT  # variant's arms take $DECODE's flags
[ -n "$STACK" ] && variant stack "$STACK"
timeout $(left 585) python3 -m scripts.bench.h2h_llama $M --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 \
  --llama-extra "-fa 1 -lm none -t 16" --styles resident --tg-only --prompt-file README.md --rounds 3 --repeats 2 \
  --prompt-tokens 1024 --gen 128 "${ARMS[@]}" --budget-s $(left 575) --keep-reports $R/reports_resident1k \
  --out $R/h2h_resident1k.json > $R/h2h_resident1k.log 2>&1
at "h2h resident rc=$?"; tail -12 $R/h2h_resident1k.log
cd $OUT && tar czf r.tgz r && rm -rf r
