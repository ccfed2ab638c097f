#!/usr/bin/env bash
# seed48 (issue 19's and 20's shape) at main, from a cold box; three calls back to back (the box keeps
# /root/m/seed48.gguf while warm). Prompts against llama.cpp at 32k (target 3 s; grouped attention landed
# for it) and 8k (target 1.0 s; the fill kernel landed for it), then decode at 1k: segments against
# directory graphs against llama.cpp's tg. seed48 takes about 170 s to synthesize and 40 s to load in each
# process, so each call holds one head-to-head of 3 rounds (untested estimate: 32k may not fit with synth).
#   PHASE=32k bash docs/wip/gpu-call-7.sh, then PHASE=8k, then PHASE=decode    carry: [".whl", ".llcuda"]
source docs/wip/device-env.sh
setup_box; llama_cuda
M=/root/m/seed48.gguf
[ -s $M ] || { python3 -m runner.cli synth $M --arch glm4moe --preset seed --quant Q4_K_M --jobs 14 > $R/synth48.log 2>&1;
               at "synth seed48 rc=$?"; }
wait
S="--profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none --warm-fill staging"
h2h() {  # $1 label, then h2h_llama arguments
  local label=$1; shift
  timeout $(left 585) python3 -m scripts.bench.h2h_llama $M --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 \
    --llama-extra "-fa 1 -lm none -t 16" --styles ot-exps-cpu --prompt-file README.md "$@" \
    --keep-reports $R/reports_$label --out $R/h2h_$label.json > $R/h2h_$label.log 2>&1
  at "h2h $label rc=$?"; tail -10 $R/h2h_$label.log
}
case ${PHASE:-32k} in
  32k) h2h prompt32k --rounds 3 --repeats 2 --prompt-tokens 32768 --gen 16 --pp-only --ours "staging=$S" ;;
  8k) h2h prompt8k --rounds 3 --repeats 2 --prompt-tokens 8192 --gen 16 --pp-only --ours "staging=$S"
      # where the first MoE layer's extra ~50 ms goes (2026-12-04d): per group host/GPU time and pool growth
      [ $(left 585) -gt 100 ] && { timeout $(left 585) python3 -m scripts.bench.prefill_ops $M --tokens 8192 \
        --warm-fill staging --out $R/prefill_ops_seed48_8192.json > $R/prefill_ops.log 2>&1; at "prefill_ops rc=$?"; } ;;
  decode) h2h decode1k --rounds 3 --prompt-tokens 1024 --gen 128 --ours "segments=$S" \
            --ours "directory=$S --decode-graph directory" ;;
esac
cd $OUT && tar czf r.tgz r && rm -rf r
