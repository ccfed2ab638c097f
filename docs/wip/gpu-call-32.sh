#!/usr/bin/env bash
# Issue 20 (2026-12-07e): prefetch a layer ahead (DirectoryDecodeGraph.PREFETCH_DEPTH, built on the CPU this
# session: the directory's prefetch mode is held to the numpy twin by the transliteration, the graph's order by
# test_token_graph.py). First its GPU tests and the directory's (directory_serve gained the prefetch argument),
# then seed48's offloaded decode at 1k against llama.cpp's tg: main, prefetch2 and prefetch5 (the best 2 and 5
# guesses of the next layer's experts, right 97% and 90% of the time on seed's routers:
# docs/perf/2026-12-07e-pregate-prediction-cpu.md), same_tokens checking the tokens. The GPU ms a token is the
# figure to read: the misses' link time (2.4 ms a token) is what prefetching takes off the critical path, and
# the wasted guesses put back on the link.
#   run: bash docs/wip/gpu-call-32.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
timeout $(left 200) python3 -m pytest -q tests/test_prefetch_cuda.py tests/test_slot_directory_cuda.py \
  > $R/pytest_prefetch.log 2>&1; echo "prefetch rc=$?" >> $R/rcs
wait
cat $R/rcs; tail -3 $R/pytest_prefetch.log
ARMS=(--ours "main=$DECODE")
if grep -q "^prefetch rc=0" $R/rcs; then
  variant prefetch2 "from runner.backends.cuda.token_graph import DirectoryDecodeGraph as G
G.PREFETCH_DEPTH = 2"
  variant prefetch5 "from runner.backends.cuda.token_graph import DirectoryDecodeGraph as G
G.PREFETCH_DEPTH = 5"
fi
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
