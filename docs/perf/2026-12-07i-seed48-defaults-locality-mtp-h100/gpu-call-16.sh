#!/usr/bin/env bash
# Issue 20 item 6's decode matrix on seed48 at 24 GiB: every process decodes 128 tokens after prompts of 1k, 8k
# and 32k (one load for the three contexts), arms segments and directory graphs at 150 slots and directory at
# 50 and auto, against llama.cpp's tg at the same depths; 3 rounds, resumable (call again until "matrix done").
# PHASE=locality runs our arms under the calibrated locality routing (item 4; labelled in each report) instead
# of the file's random router; llama.cpp has no such mode, so that phase runs ours only.
#   run: [PHASE=random|locality] bash docs/wip/gpu-call-16.sh    carry: [".whl", ".llcuda"]
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
wait
phase=${PHASE:-random}
S="--profile none --offload --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none --warm-fill staging"
[ $phase = locality ] && S="$S --routing locality-qwen3-30b-a3b"
mkdir -p /root/m/records
label=decode_$phase
done_() { python3 -c "import json,sys; sys.exit(0 if json.load(open('/root/m/records/$label.json'))['complete'] else 1)" 2>/dev/null; }
if ! done_ && [ $(left 570) -ge 60 ]; then
  resume=; [ -f /root/m/records/$label.json ] && resume=--resume
  llama=; [ $phase = locality ] && llama="--styles none"
  timeout $(left 590) python3 -m scripts.bench.h2h_llama $M --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 \
    --llama-extra "-fa 1 -lm none -t 16" --styles ot-exps-cpu $llama --prompt-file README.md --rounds 3 --repeats 2 \
    --prompt-tokens 1024,8192,32768 --gen 128 \
    --ours "segments150=$S --cache-slots 150" --ours "directory150=$S --cache-slots 150 --decode-graph directory" \
    --ours "directory50=$S --cache-slots 50 --decode-graph directory" \
    --ours "directory_auto=$S --cache-slots auto --decode-graph directory" \
    --budget-s $(left 575) $resume --keep-reports /root/m/records/reports_$label \
    --out /root/m/records/$label.json >> /root/m/records/$label.log 2>&1
  at "h2h $label rc=$?"; tail -8 /root/m/records/$label.log
fi
done_ && echo "matrix done"
cp -r /root/m/records $R/
cd $OUT && tar czf r.tgz r && rm -rf r
