#!/usr/bin/env bash
# Issue 20 (2026-12-07e): prefetch a layer ahead (DirectoryDecodeGraph.PREFETCH_DEPTH), built on the CPU this
# session: the transliteration holds the directory's prefetch mode to the numpy twin, and test_token_graph.py
# checks the graph's order.
# 1. Its GPU tests and the directory's (directory_serve gained the prefetch argument), beside the suites that
#    2026-12-07e changed without a GPU run.
# 2. seed48's offloaded decode at 1k against llama.cpp's tg with arms main, prefetch2 and prefetch5: the best 2
#    and 5 guesses of the next layer's experts, right 97% and 90% of the time on seed's routers
#    (docs/perf/2026-12-07e-pregate-prediction-cpu.md). same_tokens checks the tokens.
# Read the GPU ms a token: prefetching takes the misses' link time (2.4 ms a token) off the critical path, and
# its wrong guesses put link time back.
#   run: bash docs/wip/gpu-call-32.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
(timeout $(left 200) python3 -m pytest -q tests/test_prefetch_cuda.py tests/test_slot_directory_cuda.py \
  > $R/pytest_prefetch.log 2>&1; echo "prefetch rc=$?" >> $R/rcs) &
# the kernels 2026-12-07e restructured or whose tests it fixed, none rerun on a GPU since
(timeout $(left 200) python3 -m pytest -q tests/test_norm_rope_cuda.py tests/test_route_cuda.py \
  tests/test_nextn_graph_cuda.py tests/test_fused_launches_cuda.py > $R/pytest_since.log 2>&1
 echo "since rc=$?" >> $R/rcs) &
wait
timeout $(left 230) python3 -m pytest -q tests/test_attention_cuda.py -k replays > $R/pytest_attention.log 2>&1
echo "attention rc=$?" >> $R/rcs
cat $R/rcs; tail -3 $R/pytest_prefetch.log $R/pytest_since.log
ARMS=(--ours "main=$DECODE")
if grep -q "^prefetch rc=0" $R/rcs; then
  variant prefetch2 "from runner.backends.cuda.token_graph import DirectoryDecodeGraph as G
G.PREFETCH_DEPTH = 2"
  variant prefetch5 "from runner.backends.cuda.token_graph import DirectoryDecodeGraph as G
G.PREFETCH_DEPTH = 5"
fi
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
