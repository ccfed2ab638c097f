#!/usr/bin/env bash
# Issue 20 (2026-12-07f, built on the CPU without a GPU run): greedy decoding a step ahead of the host
# (Engine.GREEDY_AHEAD, off; runner/backends/cuda/greedy_chain.py). main's decode path changed with it:
# DecodeGraph.step is enqueue + wait, timed replays collect their events instead of waiting on each, GraphBatch
# stages its uploads in two pinned slots, greedy_f32 gained a token_out argument.
# Also sampling's top-k on the device (Engine.TOP_K_ON_DEVICE, off; cuda/top_k.cu) and `runner profile
# --temperature/--seed`.
# 1. The chain's and top_k's GPU tests and the graph suites the refactor touched (must pass: main's path changed).
# 2. seed48 offloaded at 1k against llama.cpp's tg: arms main and ahead (greedy), sampled and topk (temperature 0.8,
#    seed 1: chat's default chain). Read the host ms a token (0.45 to 0.54 greedy on 2026-12-07f's box): ahead should
#    take it near the greedy kernel's few microseconds; topk should cut sampling's row download and host sort
#    (0.32 ms a token on the CPU machine). h2h's same_tokens compares every arm with main: sampled and topk differ
#    from it by design; compare their digests with each other in generated_tokens (they must be equal).
# Deadlines are seconds into a 600 s call (device-env.sh's `left`).
#   run: bash docs/wip/gpu-call-36.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
(timeout $(left 240) python3 -m pytest -q tests/test_greedy_chain_cuda.py tests/test_top_k_cuda.py \
  > $R/pytest_chain.log 2>&1; echo "chain rc=$?" >> $R/rcs) &
(timeout $(left 240) python3 -m pytest -q tests/test_graph_survival_cuda.py tests/test_nextn_graph_cuda.py \
  tests/test_decode_segments_cuda.py > $R/pytest_graphs.log 2>&1; echo "graphs rc=$?" >> $R/rcs) &
wait
at "tests"; cat $R/rcs; for f in chain graphs; do tail -n 2 $R/pytest_$f.log; done
ARMS=(--ours "main=$DECODE")
if grep -q "^chain rc=0" $R/rcs; then
  variant ahead "from runner.engine.engine import Engine
Engine.GREEDY_AHEAD = True"
  GREEDY_DECODE=$DECODE
  DECODE="$DECODE --temperature 0.8 --seed 1"  # the sampled arms' arguments (variant reads $DECODE)
  ARMS+=(--ours "sampled=$DECODE")
  variant topk "from runner.engine.engine import Engine
Engine.TOP_K_ON_DEVICE = True"
  DECODE=$GREEDY_DECODE
fi
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
