#!/usr/bin/env bash
# The host arena pinned in place (cudaHostRegister after the fill) instead of allocated pinned: its GPU tests, then
# the ways of pinning 16 GiB timed side by side (bench_offload pinning), then the prompt matrix (gpu-call-11.sh)
# on the same clock, which runs only if the tests passed (every matrix process loads seed48 through the new path).
#   run: bash docs/wip/gpu-call-12.sh (then gpu-call-11.sh again until it prints "matrix done")
#   carry: [".whl", ".llcuda"]
export T0=$(date +%s)
source docs/wip/device-env.sh
setup_box
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
grep -E "MemTotal|MemAvailable" /proc/meminfo > $R/meminfo.txt; cat /sys/kernel/mm/transparent_hugepage/enabled >> $R/meminfo.txt
timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/test_offload_cuda.py tests/test_slot_directory_cuda.py \
  tests/test_host_store.py tests/test_loading_progress.py > $R/gpu_tests.log 2>&1
rc=$?; at "gpu tests rc=$rc"; tail -3 $R/gpu_tests.log
timeout 150 python3 -m scripts.bench.bench_offload pinning --gib 16 --runs 3 --out $R/pinning.json > $R/pinning.log 2>&1
at "pinning rc=$?"; grep -E "^(host_alloc|register)" $R/pinning.log | cut -c1-400
if [ $rc -eq 0 ]; then
  bash docs/wip/gpu-call-11.sh
else
  cd $OUT && tar czf r.tgz r && rm -rf r
fi
