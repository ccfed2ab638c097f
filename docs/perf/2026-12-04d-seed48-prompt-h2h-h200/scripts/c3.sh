#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
export PYTHONPATH=/tmp/site:/tmp/llsite
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64
ARGS="--profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none --warm-fill staging"
timeout 400 python3 -m scripts.bench.h2h_llama /root/m/seed48.gguf --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 --llama-extra "-fa 1 -lm none -t 16" --rounds 3 --repeats 2 \
  --prompt-tokens 32768 --gen 4 --styles ot-exps-cpu --pp-only --prompt-file README.md --ours "staging=$ARGS" --out $R/h2h_seed48_32k.json > $R/h2h_32k.log 2>&1
echo "h2h 32k rc=$? at $(( $(date +%s) - T0 )) s"; tail -9 $R/h2h_32k.log
for i in 1 2 3; do
  LEFT=$(( 560 - ($(date +%s) - T0) )); [ $LEFT -lt 50 ] && break
  timeout $LEFT python3 -m runner.cli profile /root/m/seed48.gguf --prompt-file README.md --prompt-tokens 2048 --gen 16 --warmup 1 --repeat 2 $ARGS --json $R/p2k_$i.json > $R/p2k_$i.log 2>&1
  echo "2k $i rc=$? at $(( $(date +%s) - T0 )) s"
  python3 -c "import json,sys; r=json.load(open('$R/p2k_$i.json')); print([(round(x['ttft_s'],3), round(x['restore_s'],3)) for x in r['runs']], r['prefill']['warm_fill'], r['timing'].get('link_limit_s'))" 2>&1 | tail -1
done
cd $OUT && tar czf r.tgz r && rm -rf r
