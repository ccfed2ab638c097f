#!/usr/bin/env bash
# The next GPU session's first device call, ready to run (about 9 minutes), from the repository root at main.
# The GPU suite runs with the six wip patches applied (git apply, reverted after it); the profiling runs at
# main. Carry .whl (the wheels and llama_cpp_python-0.3.36-src.tgz). Results in $OUT/r.tgz.
#   run: bash docs/wip/gpu-call-1.sh        carry: [".whl"]
source docs/wip/device-env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/pip.log 2>&1
mkdir -p /tmp/ll /root/m && tar xzf .whl/llama_cpp_python-0.3.36-src.tgz -C /tmp/ll
(python3 -m runner.cli synth /root/m/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 8 \
  > $R/synth8.log 2>&1; at "synth seed8 rc=$?") &
# the suite imports llama_cpp: the CPU build made off the box (portable AVX2, 2 MB; README in docs/wip), else
# build it here first and wait for it (an earlier session's first suite did not collect)
mkdir -p /tmp/llsite && tar -xJf .whl/llama_cpp-0.3.36-avx2.tar.xz -C /tmp/llsite 2>/dev/null
if python3 -c "import llama_cpp" > $R/llama_build.log 2>&1; then at "llama_cpp prebuilt"; else
  CMAKE_ARGS="-DLLAVA_BUILD=OFF" python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/llsite \
    /tmp/ll/llama_cpp_python-0.3.36 >> $R/llama_build.log 2>&1
  at "llama_cpp build rc=$?"
fi
# the box's .git may be stale: apply with plain git apply (working tree only) and restore from a copy after
mkdir -p /tmp/orig && cp -a cuda runner tests scripts docs phase README.md /tmp/orig/
# in this order: each applies on the ones before (decode-graphs and deltanet-chunked touch neighbouring lines of sizing.py)
for p in fill-kernel grouped-attention pinned-ids decode-graphs rope-store deltanet-chunked; do
  git apply docs/wip/$p.patch || echo "cannot apply $p"
done
timeout 400 python3 -m pytest -q -p no:cacheprovider -rf $(grep -l "mark.cuda" tests/*.py) > $R/gpu_suite.log 2>&1
at "suite (patches applied) rc=$?"; tail -12 $R/gpu_suite.log | grep -v "^$"
rm -rf cuda runner tests scripts docs phase README.md && cp -a /tmp/orig/* .  # back to main for the profiling
wait
S8="--offload --profile none --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none --warm-fill staging"
for n in 8192 32768; do
  LEFT=$(( 570 - ($(date +%s) - T0) )); [ $LEFT -lt 40 ] && break
  timeout $LEFT python3 -m scripts.bench.prefill_ops /root/m/seed8.gguf --tokens $n --warm-fill staging \
    --out $R/prefill_ops_seed8_$n.json > $R/prefill_ops_seed8_$n.log 2>&1
  at "prefill_ops $n rc=$?"; tail -2 $R/prefill_ops_seed8_$n.log
  LEFT=$(( 570 - ($(date +%s) - T0) )); [ $LEFT -lt 40 ] && break
  timeout $LEFT python3 -m runner.cli profile /root/m/seed8.gguf --prompt-file README.md --prompt-tokens $n --gen 16 \
    --warmup 1 --repeat 2 $S8 --json $R/profile_seed8_$n.json > $R/profile_seed8_$n.log 2>&1
  at "profile $n rc=$?"
done
LEFT=$(( 585 - ($(date +%s) - T0) ))
[ $LEFT -gt 40 ] && { timeout $LEFT python3 -m scripts.bench.bench_delta_net_cuda --shape 35b --out $R/delta_net_35b.json \
  > $R/delta_net_35b.log 2>&1; at "bench_delta_net rc=$?"; }
cd $OUT && tar czf r.tgz r && rm -rf r
