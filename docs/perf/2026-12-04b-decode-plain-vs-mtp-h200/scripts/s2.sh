#!/usr/bin/env bash
# call 2: MTP under the home-24g profile on seed8: per-step depth log; plain decode beside it; the flaky depth-zero test x3.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/pip.log 2>&1
if [ ! -d /tmp/llsite/llama_cpp ]; then
mkdir -p /tmp/ll && tar xzf .whl/llama_cpp_python-0.3.36-src.tgz -C /tmp/ll
(CMAKE_ARGS="-DLLAVA_BUILD=OFF" python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/llsite /tmp/ll/llama_cpp_python-0.3.36 > $R/llama_build.log 2>&1) &
fi
export PYTHONPATH=/tmp/site:/tmp/llsite
mkdir -p /root/m
cp .devrun/mtp_diag.py .devrun/head/
cd .devrun/head
[ -f /root/m/seed8.gguf ] || python3 -m runner.cli synth /root/m/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 12 > $R/synth.log 2>&1
wait
echo "setup done at $(( $(date +%s) - T0 )) s"
timeout 60 python3 -m runner.cli profile /root/m/seed8.gguf --prompt-file README.md --prompt-tokens 1024 --gen 16 > $R/warm.log 2>&1  # compile kernels
for i in 1 2; do for n in 8192 1024; do
timeout 90 python3 mtp_diag.py $R/steps_mtp_${n}_p$i.json profile /root/m/seed8.gguf --prompt-file README.md --prompt-tokens $n --gen 128 --profile home-24g --json $R/profile_mtp_${n}_p$i.json > $R/profile_mtp_${n}_p$i.log 2>&1; echo "mtp $n p$i rc=$? at $(( $(date +%s) - T0 )) s"
timeout 90 python3 -m runner.cli profile /root/m/seed8.gguf --prompt-file README.md --prompt-tokens $n --gen 128 --profile home-24g --draft none --json $R/profile_plain_${n}_p$i.json > $R/profile_plain_${n}_p$i.log 2>&1; echo "plain $n p$i rc=$? at $(( $(date +%s) - T0 )) s"
done; done
for i in 1 2 3; do
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_engine_cuda.py -k depth_zero > $R/depth_zero_$i.log 2>&1; echo "depth_zero $i rc=$? at $(( $(date +%s) - T0 )) s"
done
cd $OUT && tar czf r.tgz r && rm -rf r
