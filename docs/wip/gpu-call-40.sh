#!/usr/bin/env bash
# gpu-call-39 cut to fit 480 s, for a session whose refused starts left 629 s of device time (2026-12-07g):
# the tests of main's changed decode path and the new flags while seed48 synthesizes (the columns layout's bit
# identity for seed48's two types only), the fill kernel at FILL_UNROLL 1 and 4 once each, then seed48 offloaded
# against llama.cpp with arms main, ahead, cols128 and split, until 465 s (about two rounds). The arms do not wait
# for their tests: h2h_llama compares every arm's tokens with main's, run by run.
# Deadlines are seconds into the call (CALL_S stays 600: every deadline here is below 480).
#   run: bash docs/wip/gpu-call-40.sh    carry: [".whl", ".llcuda"]    timeout_s 480
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
decode_path_tests 200 "columns_layout_gives and (Q4_K or Q6_K) or one_pass"
fill_bench 235 20 1
ARMS=(--ours "main=$DECODE")
variant ahead "from runner.engine.engine import Engine
Engine.GREEDY_AHEAD = True"
variant cols128 "import runner.backends.cuda.gemv as g
g.COLUMNS_THREADS = 128"
variant split "from runner.backends.cuda.token_graph import DirectoryDecodeGraph
DirectoryDecodeGraph.SPLIT_FILLS = True"
grep -q "^pdl rc=0" $R/rcs && variant pdl "import runner.backends.cuda.launch as l
l.PDL = True"
timeout $(left 470) python3 -m scripts.bench.h2h_llama $M --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 \
  --llama-extra "-fa 1 -lm none -t 16" --styles ot-exps-cpu --tg-only --prompt-file README.md --rounds 3 --repeats 2 \
  --prompt-tokens 1024 --gen 128 "${ARMS[@]}" --budget-s $(left 462) --keep-reports $R/reports_decode1k \
  --out $R/h2h_decode1k.json > $R/h2h_decode1k.log 2>&1
at "h2h decode1k rc=$?"; tail -12 $R/h2h_decode1k.log
cd $OUT && tar czf r.tgz r && rm -rf r
