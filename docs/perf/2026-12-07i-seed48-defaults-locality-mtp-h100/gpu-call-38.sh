#!/usr/bin/env bash
# Issue 20 (2026-12-07g; its bench_gemv_cuda half ran on 2026-12-07h's gpu-call-42 and left): where resident
# seed48's 4.5 ms of GPU a token goes, kernel by kernel: ncu times each kernel node of the decode graph alone
# (scripts/bench/kernel_table.py; nsys is not on the box) over 8 tokens at 1k that bench_resident_cuda decodes
# inside cudaProfilerStart/Stop (--profile-tokens). Arms: main, and cols128 (COLUMNS_THREADS = 128) unless main
# already has it (it does since 2026-12-07h). Offloaded adds the directory kernels and the fills to this.
# With time left, MTP on seed48 offloaded at depth 1 (gpu-call-37's first half).
# Deadlines are seconds into a 600 s call (device-env.sh's `left`).
#   run: bash docs/wip/gpu-call-38.sh    carry: [".whl"]    timeout_s 600
source docs/wip/device-env.sh
setup_box
seed48
wait
at "synth"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
echo "ncu: ${NCU:-none}"; [ -n "$NCU" ] || { cd $OUT && tar czf r.tgz r && rm -rf r; exit 0; }
table() {  # table NAME PYTHON: resident seed48 after PYTHON, 8 profiled tokens at 1k
  timeout $(left $2) $NCU --profile-from-start off --graph-profiling node --metrics gpu__time_duration.sum \
    --cache-control none --clock-control none --csv --page raw --print-units base python3 -c "
import runpy, sys
$3
sys.argv = ['bench_resident_cuda', '$M', '--out', '$R/resident_$1.json', '--runs', '1', '--decode-contexts', '1024',
            '--decode-tokens', '16', '--prefill-lengths', '512', '--profile-tokens', '8']
runpy.run_module('scripts.bench.bench_resident_cuda', run_name='__main__')" > $R/ncu_$1.csv 2> $R/ncu_$1.err
  at "ncu $1 rc=$?"
  python3 -m scripts.bench.kernel_table $R/ncu_$1.csv --tokens 8 --label "seed48 resident 1k $1" \
    --out $R/kernels_$1.json 2>&1 | tail -n 18
}
table main 330 ""
python3 -c "import runner.backends.cuda.gemv as g; raise SystemExit(g.COLUMNS_THREADS == 128)" && table cols128 585 \
  "import runner.backends.cuda.gemv as g
g.COLUMNS_THREADS = 128"
# time left: gpu-call-37's first half (MTP on seed48 offloaded, forced acceptance at depth 1)
if [ $(left 380) -gt 0 ]; then
  timeout $(left 585) python3 -m scripts.bench.bench_mtp $M --slots 150 --context 1024 --tokens 64 --runs 3 \
    --accept 0.5,0.7,0.9 --forced-depth 1 --out $R/mtp_seed48_depth1.json > $R/mtp_seed48_depth1.log 2>&1
  at "mtp seed48 depth 1 rc=$?"; tail -1 $R/mtp_seed48_depth1.log | cut -c1-600
fi
cd $OUT && tar czf r.tgz r && rm -rf r
