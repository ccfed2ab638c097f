#!/usr/bin/env bash
# Issue 20 (2026-12-07h): programmatic dependent launch where nothing else moves, resident seed48 (no fills, no
# host steps: a chain of about 480 kernels a token, 4.88 ms on 07f's H100), then the microbenches gpu-call-39 left.
# 1. While seed48 synthesizes: tests/test_pdl_cuda.py (a chain of dependent kernels and decoding give the same bits
#    and tokens with launch.PDL on; every launch of PDL_MODULES goes through cuLaunchKernelEx).
# 2. bench_resident_cuda (decode at 1k, 32 tokens, 3 runs a process): main, pdl, cols128 and pdl+cols128,
#    alternated, twice; pdl only where its tests passed.
# 3. With time left: the fill kernel alone at FILL_UNROLL 1 and 4; bench_gemv_cuda at 512, 128, 128x2, 256x2.
# Deadlines are seconds into a 600 s call (device-env.sh's `left`).
#   run: bash docs/wip/gpu-call-42.sh    carry: [".whl"]    timeout_s 600
source docs/wip/device-env.sh
setup_box
seed48
timeout $(left 200) python3 -m pytest -q tests/test_pdl_cuda.py > $R/pytest_pdl.log 2>&1; echo "pdl rc=$?" >> $R/rcs
wait
at "tests and synth"; cat $R/rcs; tail -n 2 $R/pytest_pdl.log
PDL="import runner.backends.cuda.launch as l
l.PDL = True"
COLS128="import runner.backends.cuda.gemv as g
g.COLUMNS_THREADS = 128"
for i in 1 2; do
  resident main ""
  grep -q "^pdl rc=0" $R/rcs && resident pdl "$PDL"
  resident cols128 "$COLS128"
  grep -q "^pdl rc=0" $R/rcs && resident pdl_cols128 "$PDL
$COLS128"
done
[ $(left 470) -gt 0 ] && fill_bench 530 20 1
[ $(left 530) -gt 0 ] && { timeout $(left 585) python3 -m scripts.bench.bench_gemv_cuda --seed-shapes --quick \
  --repeat 20 --columns-threads 512,128,128x2,256x2 --out $R/gemv_seed_cpt.json > $R/gemv_seed_cpt.log 2>&1
  at "gemv bench rc=$?"; tail -n 1 $R/gemv_seed_cpt.log; }
cd $OUT && tar czf r.tgz r && rm -rf r
