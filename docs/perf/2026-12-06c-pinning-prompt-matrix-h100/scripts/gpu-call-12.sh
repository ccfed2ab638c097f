#!/usr/bin/env bash
# The host arena pinned in place (cudaHostRegister after the fill) instead of allocated pinned: its GPU tests, then
# the ways of pinning 16 GiB timed side by side (bench_offload pinning), then a profile of seed8 at 2k to see the
# load's fill_s and pin_s through the runner. Before the prompt matrix (gpu-call-11.sh), whose every process loads
# seed48 through the new path.
#   run: bash docs/wip/gpu-call-12.sh    carry: [".whl"]
source docs/wip/device-env.sh
setup_box
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
{ grep -E "MemTotal|MemAvailable" /proc/meminfo; cat /sys/kernel/mm/transparent_hugepage/enabled; ulimit -l; } > $R/host.txt
timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/test_offload_cuda.py tests/test_slot_directory_cuda.py \
  tests/test_timeline_cuda.py tests/test_host_store.py tests/test_loading_progress.py > $R/gpu_tests.log 2>&1
at "gpu tests rc=$?"; tail -3 $R/gpu_tests.log
timeout 150 python3 -m scripts.bench.bench_offload pinning --gib 16 --runs 3 --out $R/pinning.json > $R/pinning.log 2>&1
at "pinning rc=$?"; grep -E "^(host_alloc|register)" $R/pinning.log | cut -c1-300
wait  # seed8
timeout 120 python3 -m runner.cli profile /root/m/seed8.gguf --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 \
  --vram-budget 24 --warm-fill staging --draft none --profile none --prompt-file README.md --prompt-tokens 2048 --json $R/profile8.json > $R/profile8.log 2>&1
at "profile seed8 rc=$?"; python3 -c "import json; print(json.load(open('$R/profile8.json'))['load'])"
cd $OUT && tar czf r.tgz r && rm -rf r
