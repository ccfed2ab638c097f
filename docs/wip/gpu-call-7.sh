#!/usr/bin/env bash
# seed48 (issue 19's and 20's shape) at main, from a cold box; three calls back to back (the box keeps
# /root/m/seed48.gguf while warm). Prompts against llama.cpp at 8k (target 1.0 s) and 32k (target 3 s), each
# followed by prefill_ops at its length when time is left, then decode at 1k: segments against directory
# graphs against llama.cpp's tg. seed48 takes about 160 s to synthesize and 40 s to load in each process;
# on 2026-12-06 (H100) PHASE=8k took 505 s with the synthesis, and the 32k head-to-head alone took about
# 450 s, so run 8k first (it synthesizes) and 32k second.
#   PHASE=8k bash docs/wip/gpu-call-7.sh, then PHASE=32k, then PHASE=decode    carry: [".whl", ".llcuda"]
# PHASE=prompts: 8k and 32k in every process (h2h_llama --prompt-tokens 8192,32768: one load for both lengths),
# then prefill_ops at 32k when time is left; on a box that ran gpu-call-9, q397.gguf is removed first (disk).
source docs/wip/device-env.sh
setup_box; llama_cuda
M=/root/m/seed48.gguf
[ -s $M ] || rm -f /root/m/q397.gguf
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
ops() {  # $1 tokens: the prompt op by op (moe's parts, the ids' syncs, pool growth) when time is left
  [ $(left 585) -gt 100 ] && { timeout $(left 585) python3 -m scripts.bench.prefill_ops $M --tokens $1 \
    --warm-fill staging --out $R/prefill_ops_seed48_$1.json > $R/prefill_ops_$1.log 2>&1; at "prefill_ops $1 rc=$?"; }
}
case ${PHASE:-8k} in
  8k) h2h prompt8k --rounds 3 --repeats 2 --prompt-tokens 8192 --gen 16 --pp-only --ours "staging=$S"; ops 8192 ;;
  prompts) h2h prompts --rounds 3 --repeats 2 --prompt-tokens 8192,32768 --gen 16 --pp-only --ours "staging=$S"
           ops 32768 ;;
  32k) h2h prompt32k --rounds 3 --repeats 2 --prompt-tokens 32768 --gen 16 --pp-only --ours "staging=$S"; ops 32768 ;;
  decode) h2h decode1k --rounds 3 --prompt-tokens 1024 --gen 128 --ours "segments=$S" \
            --ours "directory=$S --decode-graph directory" ;;
esac
cd $OUT && tar czf r.tgz r && rm -rf r
