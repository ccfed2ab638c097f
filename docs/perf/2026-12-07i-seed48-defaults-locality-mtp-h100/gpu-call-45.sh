#!/usr/bin/env bash
# Issue 20 (2026-12-07h): seed48 offloaded at 1k with main's new defaults (launch.PDL, SPLIT_FILLS, COLUMNS_THREADS
# 128, GREEDY_AHEAD; docs/perf/2026-12-07h-seed48-pdl-split-ahead-h100.md) against llama.cpp's tg, beside:
# - legacy: the four switched back (07g's main), the session's gain in one call;
# - prefetch5 (PREFETCH_DEPTH 5): the serve now waits only for the prefetch's walk, its pairs run in pass 1.
# While seed48 synthesizes: the columns layout's cases 07h's deadline cut (IQ4_XS at 64 to 512 threads, the one-pass
# gate-up at 128), and the decode GPU suites, which have not run with GREEDY_AHEAD as the default (prefetch5's gate).
# Deadlines are seconds into a 600 s call (device-env.sh's `left`).
#   run: bash docs/wip/gpu-call-45.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
(timeout $(left 230) python3 -m pytest -q tests/test_gemv_cuda.py -k "columns_layout_gives and IQ4_XS or one_pass" \
  > $R/pytest_shapes.log 2>&1; echo "shapes rc=$?" >> $R/rcs) &
(timeout $(left 230) python3 -m pytest -q tests/test_prefetch_cuda.py tests/test_decode_segments_cuda.py \
  tests/test_engine_cuda.py tests/test_graph_survival_cuda.py > $R/pytest_graphs.log 2>&1
 echo "graphs rc=$?" >> $R/rcs) &
wait
at "tests and synth"; cat $R/rcs; tail -n 2 $R/pytest_shapes.log $R/pytest_graphs.log
ARMS=(--ours "main=$DECODE")
variant legacy "import runner.backends.cuda.launch as l
l.PDL = False
import runner.backends.cuda.gemv as g
g.COLUMNS_THREADS = 512
from runner.backends.cuda.token_graph import DirectoryDecodeGraph
DirectoryDecodeGraph.SPLIT_FILLS = False
from runner.engine.engine import Engine
Engine.GREEDY_AHEAD = False"
grep -q "^graphs rc=0" $R/rcs && variant prefetch5 "from runner.backends.cuda.token_graph import DirectoryDecodeGraph
DirectoryDecodeGraph.PREFETCH_DEPTH = 5"
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
