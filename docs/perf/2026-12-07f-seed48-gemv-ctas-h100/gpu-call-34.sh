#!/usr/bin/env bash
# Issue 20 (2026-12-07f), after gpu-call-33 (whose full test_gemv_cuda ran past its 230 s beside the synthesis, 212
# passed, none failed, the variant arms skipped): the new shape test alone, then seed48 offloaded at 1k against
# llama.cpp's tg with arms main (512 threads) and cols128, as many rounds as the call leaves.
#   run: CALL_S=260 bash docs/wip/gpu-call-34.sh    carry: [".whl", ".llcuda"]    timeout_s 260
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
timeout $(left 150) python3 -m pytest -q tests/test_gemv_cuda.py -k "columns_layout_gives" > $R/pytest_shapes.log 2>&1
echo "shapes rc=$?" >> $R/rcs; tail -n 2 $R/pytest_shapes.log
wait
at "synth and tests"
ARMS=(--ours "main=$DECODE")
grep -q "^shapes rc=0" $R/rcs && variant cols128 "import runner.backends.cuda.gemv as g
g.COLUMNS_THREADS = 128"
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
