#!/usr/bin/env bash
# Call 3: the CUDA suite at the snapshot; TTFT probe (first request in a process after the defines change); prefill breakdown 8k/32k.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
HEAD_SHA=$(cat .devrun/head.sha)
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/pip.log 2>&1
if [ ! -d /tmp/llsite/llama_cpp ]; then
mkdir -p /tmp/ll && tar xzf .whl/llama_cpp_python-0.3.36-src.tgz -C /tmp/ll
CMAKE_ARGS="-DLLAVA_BUILD=OFF" python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/llsite /tmp/ll/llama_cpp_python-0.3.36 > $R/llama_build.log 2>&1 &
fi
export PYTHONPATH=/tmp/site:/tmp/llsite
mkdir -p /root/m
cd .devrun/head
[ -f /root/m/seed8.gguf ] || python3 -m runner.cli synth /root/m/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 12 > $R/synth.log 2>&1
wait
echo "setup at $(( $(date +%s) - T0 )) s"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"; python3 --version; } > $R/env.txt 2>&1
timeout 330 python3 -m pytest -q -p no:cacheprovider $(grep -l "mark.cuda" tests/*.py) > $R/gpu_tests_$HEAD_SHA.log 2>&1
echo "suite rc=$? at $(( $(date +%s) - T0 )) s"; tail -4 $R/gpu_tests_$HEAD_SHA.log
P="--prompt-file README.md --gen 16 --profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none"
timeout 60 python3 ../ttft_probe.py $R/ttft.json profile /root/m/seed8.gguf $P --prompt-tokens 8192 --json $R/prof8k.json > $R/ttft.log 2>&1
echo "probe rc=$? at $(( $(date +%s) - T0 )) s"; grep PROBE $R/ttft.log
cp ../prefill_breakdown.py .
for n in 8192 32768; do
timeout 60 python3 prefill_breakdown.py /root/m/seed8.gguf --tokens $n --out $R/breakdown_$n.json > $R/breakdown_$n.log 2>&1
echo "breakdown $n rc=$? at $(( $(date +%s) - T0 )) s"; tail -1 $R/breakdown_$n.log
done
cd $OUT && tar czf r.tgz r && rm -rf r
