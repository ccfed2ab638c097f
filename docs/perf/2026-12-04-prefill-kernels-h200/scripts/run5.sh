#!/usr/bin/env bash
# Final measurements for issue 19: the CUDA suite at HEAD, a same-call A/B of layer-major prefill (8117adc,
# the session's base, against HEAD; 3 processes per arm, alternated) and runner profile at 8k and 32k, on seed8.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
HEAD_SHA=$(cat .devrun/head.sha)
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/pip.log 2>&1
if [ ! -d /tmp/llsite/llama_cpp ]; then
mkdir -p /tmp/ll && tar xzf .whl/llama_cpp_python-0.3.36-src.tgz -C /tmp/ll
(CMAKE_ARGS="-DLLAVA_BUILD=OFF" python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/llsite /tmp/ll/llama_cpp_python-0.3.36 > $R/llama_build.log 2>&1) &
fi
export PYTHONPATH=/tmp/site:/tmp/llsite
mkdir -p /root/m
cd .devrun/head
[ -f /root/m/seed8.gguf ] || python3 -m runner.cli synth /root/m/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 12 > $R/synth.log 2>&1
wait
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"; nproc; } > $R/env.txt 2>&1
echo "setup done at $(( $(date +%s) - T0 )) s"
cd ..
for i in 1 2 3; do for arm in old head; do
  sha=$([ $arm = old ] && echo 8117adc || echo $HEAD_SHA)
  (cd $arm && timeout 100 python3 -m scripts.bench.bench_offload prefill /root/m/seed8.gguf --order layer_major --ubatch 2048 --lengths 8192,32768 --runs 2 --slots 150 --commit $sha --out $R/prefill_${arm}_p$i.json > $R/prefill_${arm}_p$i.log 2>&1; echo "prefill $arm p$i rc=$? at $(( $(date +%s) - T0 )) s")
done; done
(cd head && timeout 60 python3 -m scripts.bench.bench_offload bandwidth --out $R/bandwidth.json --commit $HEAD_SHA > $R/bandwidth.log 2>&1; echo "bandwidth rc=$?")
cd head
for n in 8192 32768; do
  timeout 90 python3 -m runner.cli profile /root/m/seed8.gguf --prompt-file README.md --prompt-tokens $n --gen 8 --json $R/profile_$n.json > $R/profile_$n.log 2>&1; echo "profile $n rc=$?"
done
timeout $(( 590 - $(date +%s) + T0 )) python3 -m pytest -q -p no:cacheprovider $(grep -l "mark.cuda" tests/*.py) > $R/gpu_tests.log 2>&1; echo "suite rc=$? at $(( $(date +%s) - T0 )) s"
tail -4 $R/gpu_tests.log
cd $OUT && tar czf r.tgz r && rm -rf r
