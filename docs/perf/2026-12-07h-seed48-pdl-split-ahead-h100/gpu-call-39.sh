#!/usr/bin/env bash
# Issue 20 (2026-12-07g): gpu-call-36's and 35's first halves in one call, for a session whose device starts kept
# failing (each refused start costs 90 s of the 1,800). Main's decode path changed on the CPU after the last GPU run
# (DecodeGraph.enqueue, GraphBatch's pinned slots, greedy_f32's token_out), so its tests come first:
# 1. in parallel while seed48 synthesizes: the greedy chain's and top_k's GPU tests; the graph suites (with the
#    new SPLIT_FILLS case in test_decode_segments_cuda); the columns layout's bit identity at 64 to 512 threads.
# 2. seed48 offloaded at 1k against llama.cpp's tg, arms (each only where its tests passed): main; ahead
#    (Engine.GREEDY_AHEAD: the host's 0.45 to 0.54 ms a token off the critical path); cols128 (COLUMNS_THREADS =
#    128: 4x the CTAs of the decode products); split (DirectoryDecodeGraph.SPLIT_FILLS: a miss's gate-up runs once
#    its gate and up bytes land, only its down waits for the rest); pdl (launch.PDL, 2026-12-07h: programmatic
#    dependent launch, each kernel's blocks resident and its weights asked of L2 while the one before runs).
#    (The fill kernel alone at FILL_UNROLL 1 and 4 moved to gpu-call-42: five arms and llama.cpp take about 130 s a
#    round.)
# Deadlines are seconds into a 600 s call (device-env.sh's `left`).
#   run: bash docs/wip/gpu-call-39.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
decode_path_tests 230 "columns_layout_gives or one_pass"
ARMS=(--ours "main=$DECODE")
grep -q "^chain rc=0" $R/rcs && variant ahead "from runner.engine.engine import Engine
Engine.GREEDY_AHEAD = True"
grep -q "^shapes rc=0" $R/rcs && variant cols128 "import runner.backends.cuda.gemv as g
g.COLUMNS_THREADS = 128"
grep -q "^graphs rc=0" $R/rcs && variant split "from runner.backends.cuda.token_graph import DirectoryDecodeGraph
DirectoryDecodeGraph.SPLIT_FILLS = True"
grep -q "^pdl rc=0" $R/rcs && variant pdl "import runner.backends.cuda.launch as l
l.PDL = True"
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
