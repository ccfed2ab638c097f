# Session 5, call 4: seed48 decode at 150 slots, context 1k, one process per arm in turn: HEAD (50456be,
# host-step change), 70912d7 (the profile's last decode figures), 26c1500 (HEAD less the host-step change).
export PYTHONUNBUFFERED=1 SHA=$(cat .devrun/sha)
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
ROOT=$PWD; M=/root/models; Q=/root/s5c4; mkdir -p $M $Q
pack() { (cd $Q/.. && tar czf $OUT/results.tgz s5c4); }
trap pack EXIT
cd $ROOT/.snap_head; export PYTHONPATH=/tmp/site:$PWD
t0=$SECONDS; python3 -m runner.cli synth $M/seed48.gguf --arch glm4moe --preset seed --quant Q4_K_M --jobs 16 > $Q/synth.log 2>&1; echo "synth rc=$? $((SECONDS - t0)) s"
show() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], d['load_s'], {c: (round(v['decode_tok_s']['median'],1), round(v['steady_decode_tok_s']['median'],1), round(v['host_step_ms_per_token']['median'],3), round(v['ids_wait_ms_per_token']['median'],3), round(v['hit_rate']['median'],4)) for c, v in d['contexts'].items()})" $1; }
n=0
for arm in head old head old before; do
  n=$((n + 1)); [ $((SECONDS + 70)) -gt 445 ] && { echo "stop before $arm $n (deadline)"; break; }
  cd $ROOT/.snap_$arm; export PYTHONPATH=/tmp/site:$PWD
  sha=$(case $arm in head) echo $SHA;; old) echo 70912d7;; before) echo 26c1500;; esac)
  echo "$n $arm: python3 scripts/bench_offload.py decode seed48.gguf --slots 150 --contexts 1024 --tokens 32 --runs 3 --commit $sha" >> $Q/commands.txt
  timeout 70 python3 scripts/bench_offload.py decode $M/seed48.gguf --slots 150 --contexts 1024 --tokens 32 --runs 3 --commit $sha --out $Q/ab_${n}_${arm}.json > /dev/null 2> $Q/ab_${n}_${arm}.err
  echo "rc=$? at $SECONDS s"; show $Q/ab_${n}_${arm}.json; pack
done
