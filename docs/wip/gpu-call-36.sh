#!/usr/bin/env bash
# Issue 20 (2026-12-07f, built on the CPU without a GPU run): greedy decoding a step ahead of the host
# (Engine.GREEDY_AHEAD, off; runner/backends/cuda/greedy_chain.py). main's decode path changed with it:
# DecodeGraph.step is enqueue + wait, timed replays collect their events instead of waiting on each, GraphBatch
# stages its uploads in two pinned slots, greedy_f32 gained a token_out argument.
# 1. The chain's GPU tests and the graph suites the refactor touched (must pass: main's path changed).
# 2. seed48 offloaded at 1k against llama.cpp's tg: arms main and ahead. Read the host ms a token (0.45 to 0.54
#    on 2026-12-07f's box): a step ahead should take it to about the greedy kernel's few microseconds.
# Deadlines are seconds into a 600 s call (device-env.sh's `left`).
#   run: bash docs/wip/gpu-call-36.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
(timeout $(left 240) python3 -m pytest -q tests/test_greedy_chain_cuda.py > $R/pytest_chain.log 2>&1
 echo "chain rc=$?" >> $R/rcs) &
(timeout $(left 240) python3 -m pytest -q tests/test_graph_survival_cuda.py tests/test_nextn_graph_cuda.py \
  tests/test_decode_segments_cuda.py > $R/pytest_graphs.log 2>&1; echo "graphs rc=$?" >> $R/rcs) &
wait
at "tests"; cat $R/rcs; for f in chain graphs; do tail -n 2 $R/pytest_$f.log; done
ARMS=(--ours "main=$DECODE")
grep -q "^chain rc=0" $R/rcs && variant ahead "from runner.engine.engine import Engine
Engine.GREEDY_AHEAD = True"
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
