#!/usr/bin/env bash
# Issue 21 item 7: a qwen35moe file of the 397B-A17B shape (512 experts of 1024, top-10, hidden 4096; DeltaNet
# layers three in four) cut to LAYERS layers (default 8: about 29 GB of Q4_K_M experts; the box has 64 GB of
# disk and seed8 sits beside it), against llama.cpp on the same file: prompts at 2k, 8k and 32k
# (layer-major, 150 slots, 24 GiB, warm fill from staging) and decode at 1k, plain and with MTP (the
# file's NextN block). Two calls back to back on one box (a process's load is about 25 s):
#   PHASE=a: synthesis (about 2 minutes at 14 jobs) with the GPU tests of GPU_TESTS beside it (the patch
#            .ab/ptrs.patch is taken back off the tree if they fail), then the prompts, all three lengths in
#            every process (h2h_llama --prompt-tokens 2048,8192,32768);
#   PHASE=b: decode at 1k, plain and MTP.
#   run: PHASE=a bash docs/wip/gpu-call-9.sh, then PHASE=b    carry: [".whl", ".llcuda", ".ab"]
source docs/wip/device-env.sh
setup_box; llama_cuda
M=/root/m/q397.gguf
[ -s $M ] || { python3 -m runner.cli synth $M --arch qwen35moe --preset qwen35-397b-a17b --layers ${LAYERS:-8} \
  --quant Q4_K_M --jobs 14 > $R/synth.log 2>&1; at "synth rc=$?"; } &
if [ -n "${GPU_TESTS:-}" ]; then
  timeout 170 python3 -m pytest -q -x $GPU_TESTS > $R/gpu_tests.log 2>&1; rc=$?
  at "gpu tests rc=$rc"; tail -3 $R/gpu_tests.log
  [ $rc = 0 ] || { git apply -R .ab/ptrs.patch && echo "ptrs.patch taken back off"; }
fi
wait
S="--profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --warm-fill staging"
h2h() {  # $1 label, then h2h_llama arguments
  local label=$1; shift
  [ $(left 540) -lt 60 ] && return
  timeout $(left 570) python3 -m scripts.bench.h2h_llama $M --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 \
    --llama-extra "-fa 1 -lm none -t 16" --styles ot-exps-cpu --prompt-file README.md --rounds 3 --repeats 2 "$@" \
    --keep-reports $R/reports_$label --out $R/h2h_$label.json > $R/h2h_$label.log 2>&1
  at "h2h $label rc=$?"; tail -6 $R/h2h_$label.log
}
case ${PHASE:-a} in
  a) h2h prompts --prompt-tokens 2048,8192,32768 --gen 16 --pp-only --ours "staging=$S --draft none" ;;
  b) h2h decode1k --prompt-tokens 1024 --gen 128 --ours "plain=$S --draft none" --ours "mtp=$S --draft mtp" ;;
esac
cd $OUT && tar czf r.tgz r && rm -rf r
