# Session 5, call 2: GPU tests of the host-step change (50456be) beside seed8's synthesis; then offloaded
# decode on seed8 at 150 slots, before (26c1500) and after, in alternating processes; then the probe.
export PYTHONUNBUFFERED=1 SHA=$(cat .devrun/sha)
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
P=$PWD/.devrun; ROOT=$PWD; M=/root/models; Q=/root/s5c2; mkdir -p $M $Q
pack() { (cd $Q/.. && tar czf $OUT/results.tgz s5c2); }
trap pack EXIT
cd $ROOT/.snap_head; export PYTHONPATH=/tmp/site:$PWD
( [ -f $M/seed8.gguf ] || python3 -m runner.cli synth $M/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 16 > $Q/synth.log 2>&1 ) &
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_engine_cuda.py tests/test_decode_segments_cuda.py tests/test_offload_cuda.py tests/test_timeline_cuda.py > $Q/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -3 $Q/gpu_tests.log
wait
for i in 1 2; do for arm in before head; do
  cd $ROOT/.snap_$arm; export PYTHONPATH=/tmp/site:$PWD
  sha=$([ $arm = head ] && echo $SHA || echo 26c1500)
  timeout 120 python3 scripts/bench_offload.py decode $M/seed8.gguf --slots 150 --contexts 1024,8192 --tokens 64 --runs 3 --commit $sha --out $Q/decode_seed8_${arm}_$i.json > /dev/null 2> $Q/decode_seed8_${arm}_$i.err
  echo "$arm $i rc=$?"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({c: (round(v['decode_tok_s']['median'],1), round(v['steady_decode_tok_s']['median'],1), round(v['host_step_ms_per_token']['median'],3), round(v['ids_wait_ms_per_token']['median'],3), round(v['hit_rate']['median'],4)) for c, v in d['contexts'].items()})" $Q/decode_seed8_${arm}_$i.json
done; done
cd $ROOT/.snap_head; export PYTHONPATH=/tmp/site:$PWD
timeout 120 python3 $P/hoststep_probe.py $M/seed8.gguf --slots 150 --out $Q/probe_150.json > $Q/probe_150.log 2>&1; echo "probe rc=$?"; tail -48 $Q/probe_150.log | head -30
