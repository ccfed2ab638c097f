#!/usr/bin/env bash
# Issue 20 (2026-12-07f): the columns layout's CTA size (gemv_cuda.COLUMNS_THREADS, 16 threads a column; ncu on
# gpu-call-30 found a 2048 x 2048 Q4_K product on 64 CTAs of 512 threads, 0.24 waves of an H100, DRAM at 7%) and
# expert_gate_up reading gate and up in one pass (main now).
# 1. test_gemv_cuda (the shapes' bits against 512 threads, gate_up's against swiglu of two expert_gemv),
#    gemv_multi and the fused launches.
# 2. bench_gemv_cuda --seed-shapes at 512, 256 and 128 threads.
# 3. resident seed48, main and cols128 alternated; then seed48 offloaded at 1k against llama.cpp's tg: arms main
#    (512), cols256, cols128.
#   run: bash docs/wip/gpu-call-33.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
(timeout $(left 230) python3 -m pytest -q tests/test_gemv_cuda.py > $R/pytest_gemv.log 2>&1
 echo "gemv rc=$?" >> $R/rcs) &
(timeout $(left 230) python3 -m pytest -q tests/test_gemv_multi_cuda.py tests/test_fused_launches_cuda.py \
  tests/test_gemv_launch_shape.py > $R/pytest_multi.log 2>&1; echo "multi rc=$?" >> $R/rcs) &
wait
at "tests"; cat $R/rcs; tail -n 3 $R/pytest_gemv.log; tail -n 3 $R/pytest_multi.log
timeout $(left 300) python3 -m scripts.bench.bench_gemv_cuda --seed-shapes --quick --repeat 20 \
  --columns-threads 512,256,128 --out $R/gemv_seed_threads.json > $R/gemv_seed_threads.log 2>&1
at "bench gemv rc=$?"
ARMS=(--ours "main=$DECODE")
if grep -q "^gemv rc=0" $R/rcs; then
  variant cols256 "import runner.backends.cuda.gemv as g
g.COLUMNS_THREADS = 256"
  variant cols128 "import runner.backends.cuda.gemv as g
g.COLUMNS_THREADS = 128"
fi
for i in 1 2; do
  resident main ""
  grep -q "^gemv rc=0" $R/rcs && resident cols128 "import runner.backends.cuda.gemv as g
g.COLUMNS_THREADS = 128"
done
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
