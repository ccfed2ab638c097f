# Session 5, call 1: GPU tests at HEAD (the warp-parallel attention merge had not met the engine,
# segment and offload tests), beside seed8's synthesis; then the host-step probe on seed8 at 150 slots.
export PYTHONUNBUFFERED=1 SHA=$(cat .devrun/sha)
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
P=$PWD/.devrun; cd .snap_head; export PYTHONPATH=/tmp/site:$PWD
M=/root/models; Q=/root/s5; mkdir -p $M $Q
pack() { (cd $Q/.. && tar czf $OUT/results.tgz s5); }
trap pack EXIT
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv; nproc; free -g; df -h /root; } > $Q/env.txt 2>&1
( python3 -m runner.cli synth $M/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 16 > $Q/synth.log 2>&1 ) &
timeout 260 python3 -m pytest -q -p no:cacheprovider tests/test_engine_cuda.py tests/test_decode_segments_cuda.py tests/test_offload_cuda.py tests/test_moe_prefill_cuda.py tests/test_moe_cuda.py tests/test_ops_cuda.py tests/test_timeline_cuda.py tests/test_sample_cuda.py tests/test_norm_rope_cuda.py > $Q/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -3 $Q/gpu_tests.log
wait; tail -1 $Q/synth.log
timeout 200 python3 $P/hoststep_probe.py $M/seed8.gguf --slots 150 --out $Q/probe_150.json > $Q/probe_150.log 2>&1; echo "probe rc=$?"; tail -60 $Q/probe_150.log
