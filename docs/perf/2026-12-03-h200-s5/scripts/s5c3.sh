# Session 5, call 3: does pinning the process to one core steady the host step (seed8, 150 slots,
# alternating processes)? Then seed48 at HEAD (50456be): decode at 150 slots in two processes and at auto.
export PYTHONUNBUFFERED=1 SHA=$(cat .devrun/sha)
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
ROOT=$PWD; M=/root/models; Q=/root/s5c3; mkdir -p $M $Q
pack() { (cd $Q/.. && tar czf $OUT/results.tgz s5c3); }
trap pack EXIT
cd $ROOT/.snap_head; export PYTHONPATH=/tmp/site:$PWD
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv; nproc; lscpu | head -20; free -g; df -h /root; } > $Q/env.txt 2>&1
[ -f $M/seed8.gguf ] || python3 -m runner.cli synth $M/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 16 > $Q/synth8.log 2>&1
show() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], {c: (round(v['decode_tok_s']['median'],1), round(v['steady_decode_tok_s']['median'],1), round(v['host_step_ms_per_token']['median'],3), round(v['ids_wait_ms_per_token']['median'],3), round(v['hit_rate']['median'],4)) for c, v in d['contexts'].items()})" $1; }
for i in 1 2; do for arm in free pinned; do
  pre=""; [ $arm = pinned ] && pre="taskset -c 5"
  echo "decode_seed8_$arm: $pre python3 scripts/bench_offload.py decode seed8.gguf --slots 150 --contexts 1024 --tokens 64 --runs 3" >> $Q/commands.txt
  timeout 90 $pre python3 scripts/bench_offload.py decode $M/seed8.gguf --slots 150 --contexts 1024 --tokens 64 --runs 3 --commit $SHA --out $Q/affinity_seed8_${arm}_$i.json > /dev/null 2> $Q/affinity_${arm}_$i.err; show $Q/affinity_seed8_${arm}_$i.json
done; done
rm -f $M/seed8.gguf
bash scripts/qualify_home24g.sh $M $Q $SHA synth
for s in decode150 decodeauto; do
  RESUME=0 DEADLINE_S=$((575 - SECONDS)) AFTER_STEP=pack bash scripts/qualify_home24g.sh $M $Q $SHA $s; done
for f in $Q/decode_*.json; do show $f; done
mv $Q/decode_150.json $Q/decode_150_p1.json
DEADLINE_S=$((590 - SECONDS)) AFTER_STEP=pack bash scripts/qualify_home24g.sh $M $Q $SHA decode150; [ -f $Q/decode_150.json ] && show $Q/decode_150.json
