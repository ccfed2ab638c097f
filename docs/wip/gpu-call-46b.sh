#!/usr/bin/env bash
# Issue 20 (2026-12-08): gpu-call-46.sh's second half, on its warm box (seed48 and /root/m/rcs46, the return codes of
# its tests, are on the box's disk): offloaded seed48 at 1k, fresh processes, main, early (the directory read before
# the PDL wait) and stack (every change whose GPU tests passed in 46) against llama.cpp's tg on the same file.
# On a fresh box it synthesizes seed48 and runs main against llama.cpp alone (no test has passed there).
#   run: bash docs/wip/gpu-call-46b.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
wait
at "synth"
touch /root/m/rcs46; cp /root/m/rcs46 $R/rcs; cat $R/rcs
ok() { grep -q "^$1 rc=0" $R/rcs; }
G="import runner.backends.cuda.gemv as g"
EARLY="from runner.backends.cuda.token_graph import DirectoryDecodeGraph
DirectoryDecodeGraph.EARLY_SERVE = True"
STACK=""
ok route && STACK="$STACK
$G
g.ROUTE_WARP_COLUMNS, g.ROUTE_LOAD_AHEAD = 1, 8"
ok gateup && STACK="$STACK
$G
g.GATE_UP_MIN_BLOCKS = 6"
ok half && STACK="$STACK
$G
g.EXPERT_HALF_SLICES = True"
ok directory && ok early && STACK="$STACK
$EARLY"
ok ahead && STACK="$STACK
from runner.backends.cuda import attention
attention.DEC_K_AHEAD, attention.DEC_V_AHEAD = 16, 8"
echo "stack:$STACK" > $R/stack.txt
ARMS=(--ours "main=$DECODE")
ok directory && ok early && variant early "$EARLY"
[ -n "$STACK" ] && variant stack "$STACK"
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
