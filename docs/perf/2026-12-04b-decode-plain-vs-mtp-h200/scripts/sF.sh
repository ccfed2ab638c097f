#!/usr/bin/env bash
# final call: llama-cpp-python build || decode attention sweep (seed, auto vs 4 slots at 128-key splits);
# the CUDA suite; then MTP's cost model on the demo model resident (graph-replayed verify batches).
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
cd .devrun/head
PYTHONPATH=/tmp/site timeout 80 python3 -m scripts.bench.bench_attention_cuda --shape seed --decode-only --repeat 20 --kv-chunks 128 --dec-slots auto,4 --commit $HEAD_SHA --out $R/attn_auto_seed.json > $R/attn_auto_seed.log 2>&1; echo "attn rc=$? at $(( $(date +%s) - T0 )) s"
wait
export PYTHONPATH=/tmp/site:/tmp/llsite
echo "setup done at $(( $(date +%s) - T0 )) s"
timeout $(( 330 - $(date +%s) + T0 )) python3 -m pytest -q -p no:cacheprovider $(grep -l "mark.cuda" tests/*.py) > $R/gpu_tests.log 2>&1; echo "suite rc=$? at $(( $(date +%s) - T0 )) s"
tail -30 $R/gpu_tests.log | grep -v "^\.\.\.\." 
LEFT=$(( 385 - $(date +%s) + T0 ))
[ $LEFT -gt 20 ] && { timeout $LEFT python3 -m scripts.bench.bench_mtp runner/data/demo.gguf --slots resident --runs 3 --tokens 64 --commit $HEAD_SHA --out $R/mtp_demo_resident.json > $R/mtp_demo_resident.log 2>&1; echo "mtp demo rc=$? at $(( $(date +%s) - T0 )) s"; }
cd $OUT && tar czf r.tgz r && rm -rf r
