#!/usr/bin/env bash
# Issue 19 item 6's other file: a glm45-air-shaped glm4moe (128 experts of 1408, top-8: the 1408-wide rows take
# the Q5_0/Q8_0 fallbacks of Q4_K_M) with as many layers as the box's 64 GB disk holds (seed48 and q397 are deleted
# first; seed8 stays): 32 layers, about 49 GB by arithmetic (1.47 GB of experts a layer). Prompts of 2k, 8k and 32k
# in every process, layer-major at micro-batch 2048 against llama.cpp ub2048, 3 processes an arm; resumes on a warm
# box like gpu-call-11.
#   run: bash docs/wip/gpu-call-13.sh (again until it prints "air done")    carry: [".whl", ".llcuda"]
source docs/wip/device-env.sh
setup_box; llama_cuda
M=/root/m/air32.gguf
[ -s $M ] || { rm -f /root/m/seed48.gguf /root/m/q397.gguf; df -h /root | tail -1 > $R/disk.txt
  python3 -m runner.cli synth $M --arch glm4moe --preset glm45-air --layers 32 --quant Q4_K_M --jobs 14 \
    > $R/synth_air.log 2>&1; at "synth air32 rc=$?"; }
wait
S="--profile none --offload --cache-slots auto -ub 512 --vram-budget 24 --draft none --warm-fill staging"
mkdir -p /root/m/records
complete() { python3 -c "import json,sys; sys.exit(0 if json.load(open('/root/m/records/$1.json'))['complete'] else 1)" 2>/dev/null; }
label=air32
if ! complete $label && [ $(left 570) -ge 60 ]; then
  resume=; [ -f /root/m/records/$label.json ] && resume=--resume
  timeout $(left 590) python3 -m scripts.bench.h2h_llama $M --llama-bench /tmp/lc/pkg/bin/llama-bench \
    --llama-extra "-fa 1 -lm none -t 16" --styles ot-exps-cpu --prompt-file README.md --rounds 3 --repeats 2 \
    --gen 16 --pp-only --prompt-tokens 2048,8192,32768 --ubatch 2048 \
    --ours "lm2048=$S --prefill-order layer_major --prefill-ubatch 2048" --budget-s $(left 575) $resume \
    --keep-reports /root/m/records/reports_$label --out /root/m/records/$label.json >> /root/m/records/$label.log 2>&1
  at "h2h $label rc=$?"; tail -4 /root/m/records/$label.log
fi
complete $label && echo "air done"
cp -r /root/m/records $R/
cd $OUT && tar czf r.tgz r && rm -rf r
