#!/usr/bin/env bash
# Issue 19 item 6: the prompt matrix on seed48 at 24 GiB against llama.cpp on the same file, as many calls as
# it takes on one warm box (each call resumes the records the one before left unfinished: h2h_llama --resume,
# and starts no process that would pass the call's limit: --budget-s). Every process runs 2k, 8k and 32k
# (h2h_llama --prompt-tokens 2048,8192,32768: one load of seed48, about 40 s, for three lengths).
#   matrix_a: layer-major at ub 2048 (home-24g's setting) and 512, per micro-batch at 2048, llama.cpp ub2048;
#   matrix_b: per micro-batch at 512 and llama.cpp ub512, at 2k and 8k only: at 32k each prompt of either
#             crosses the expert set 64 times (about 56 s on the link alone), which the arithmetic gives.
# Estimated 850 s for matrix_a and 450 s for matrix_b with 160 s of synthesis: three calls.
#   run: bash docs/wip/gpu-call-11.sh (again until it prints "matrix done")    carry: [".whl", ".llcuda"]
source docs/wip/device-env.sh
setup_box; llama_cuda
M=/root/m/seed48.gguf
[ -s $M ] || { rm -f /root/m/q397.gguf; python3 -m runner.cli synth $M --arch glm4moe --preset seed --quant Q4_K_M \
  --jobs 14 > $R/synth48.log 2>&1; at "synth seed48 rc=$?"; }
wait
S="--profile none --offload --cache-slots 150 -ub 512 --vram-budget 24 --draft none --warm-fill staging"
LM="--prefill-order layer_major" PM="--prefill-order per_microbatch"
mkdir -p /root/m/records
complete() { python3 -c "import json,sys; sys.exit(0 if json.load(open('/root/m/records/$1.json'))['complete'] else 1)" 2>/dev/null; }
h2h() {  # $1 label, then h2h_llama arguments; the record lives on the box's disk between calls
  local label=$1; shift
  complete $label && return
  [ $(left 570) -lt 60 ] && return
  local resume=; [ -f /root/m/records/$label.json ] && resume=--resume
  timeout $(left 590) python3 -m scripts.bench.h2h_llama $M --llama-bench /tmp/lc/pkg/bin/llama-bench \
    --llama-extra "-fa 1 -lm none -t 16" --styles ot-exps-cpu --prompt-file README.md --rounds 3 --repeats 2 \
    --gen 16 --pp-only "$@" --budget-s $(left 575) $resume --keep-reports /root/m/records/reports_$label \
    --out /root/m/records/$label.json >> /root/m/records/$label.log 2>&1
  at "h2h $label rc=$?"; tail -4 /root/m/records/$label.log
}
h2h matrix_a --prompt-tokens 2048,8192,32768 --ubatch 2048 --ours "lm2048=$S $LM --prefill-ubatch 2048" \
  --ours "lm512=$S $LM --prefill-ubatch 512" --ours "pm2048=$S $PM --prefill-ubatch 2048"
h2h matrix_b --prompt-tokens 2048,8192 --ubatch 512 --ours "pm512=$S $PM --prefill-ubatch 512"
complete matrix_a && complete matrix_b && echo "matrix done"
cp -r /root/m/records $R/
cd $OUT && tar czf r.tgz r && rm -rf r
