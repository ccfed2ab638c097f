#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
if [ ! -d /tmp/llsite/llama_cpp ]; then
mkdir -p /tmp/ll && tar xzf .whl/llama_cpp_python-0.3.36-src.tgz -C /tmp/ll
(CMAKE_ARGS="-DLLAVA_BUILD=OFF" python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/llsite /tmp/ll/llama_cpp_python-0.3.36 > $OUT/llama_build.log 2>&1) &
fi
export PYTHONPATH=/tmp/site:/tmp/llsite
mkdir -p /root/m
cd .devrun/head
[ -f /root/m/seed8.gguf ] || python3 -m runner.cli synth /root/m/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 12 > $OUT/synth.log 2>&1
wait
echo "setup done at $(( $(date +%s) - T0 )) s"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_moe_prefill_cuda.py tests/test_offload_cuda.py tests/test_grid_types_cuda.py tests/test_timeline_cuda.py > $OUT/tests.log 2>&1; echo "tests rc=$? at $(( $(date +%s) - T0 )) s"; tail -3 $OUT/tests.log
for n in 8192 32768; do
  PYTHONPATH=$PYTHONPATH:$PWD timeout 100 python3 ../prefill_breakdown.py /root/m/seed8.gguf --tokens $n --out $OUT/breakdown_$n.json > $OUT/breakdown_$n.log 2>&1; echo "breakdown $n rc=$?"; tail -1 $OUT/breakdown_$n.log | cut -c1-400
done
cd ..
for i in 1 2 3; do for arm in old head; do
  (cd $arm && timeout 100 python3 -m scripts.bench.bench_offload prefill /root/m/seed8.gguf --order layer_major --ubatch 2048 --lengths 8192,32768 --runs 2 --slots 150 --out $OUT/prefill_${arm}_p$i.json > $OUT/prefill_${arm}_p$i.log 2>&1; echo "prefill $arm p$i rc=$? at $(( $(date +%s) - T0 )) s")
done; done
