#!/usr/bin/env bash
# Issue 20 (2026-12-07f, written after the session's device time ran out): the same-box A/B that gpu-call-33 and 34
# left open. main now has FUSED_NORMS on (resident A/B on gpu-call-31) and expert_gate_up in one pass
# (GATE_UP_ONE_PASS; bench_gemv_cuda: slower at 512 threads, two waves; faster at 128); COLUMNS_THREADS stays 512
# until this call says otherwise (bench_gemv_cuda on gpu-call-33: 128 threads faster for nearly every seed48
# product, the Q6_K LM head 176 -> 124 us).
# 1. test_gemv_cuda's new tests at 512 threads; the whole file at 128 threads (pytest in-process with
#    COLUMNS_THREADS = 128); the fused launches' suite (FUSED_NORMS is now the default).
# 2. resident seed48, main, cols128 and twopass alternated, twice (gpu-call-33's box gave main with the one-pass
#    gate_up 5.18 ms against 5.01 on gpu-call-31's box before it: two waves of 160 CTAs at 512 threads?).
# 3. seed48 offloaded at 1k against llama.cpp's tg: arms main, cols128, twopass (GATE_UP_ONE_PASS off).
# Deadlines are seconds into a 600 s call (device-env.sh's `left`).
#   run: bash docs/wip/gpu-call-35.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
(timeout $(left 150) python3 -m pytest -q tests/test_gemv_cuda.py -k "columns_layout_gives or one_pass" \
  > $R/pytest_shapes.log 2>&1; echo "shapes rc=$?" >> $R/rcs) &
(timeout $(left 240) python3 -c "
import sys, pytest
import runner.backends.cuda.gemv as g
g.COLUMNS_THREADS = 128
sys.exit(pytest.main(['-q', 'tests/test_gemv_cuda.py', 'tests/test_gemv_multi_cuda.py']))" > $R/pytest_gemv128.log 2>&1
 echo "gemv128 rc=$?" >> $R/rcs) &
(timeout $(left 240) python3 -m pytest -q tests/test_fused_launches_cuda.py > $R/pytest_fused.log 2>&1
 echo "fused rc=$?" >> $R/rcs) &
wait
at "tests"; cat $R/rcs; for f in shapes gemv128 fused; do tail -n 2 $R/pytest_$f.log; done
COLS128="import runner.backends.cuda.gemv as g
g.COLUMNS_THREADS = 128"
TWOPASS="import runner.backends.cuda.gemv as g
g.GATE_UP_ONE_PASS = False"
for i in 1 2; do
  resident main ""
  grep -q "^shapes rc=0" $R/rcs && { resident cols128 "$COLS128"; resident twopass "$TWOPASS"; }
done
ARMS=(--ours "main=$DECODE")
if grep -q "^shapes rc=0" $R/rcs; then
  variant cols128 "$COLS128"
  variant twopass "$TWOPASS"
fi
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
