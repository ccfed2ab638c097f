#!/usr/bin/env bash
# Issue 20 (2026-12-08): gpu-call-46.sh's second half, on its warm box (seed48 and /root/m/rcs46, the return codes of
# its tests and decode_arms46.json, its resident screen, are on the box's disk): offloaded seed48 at 1k, fresh
# processes, main, old (gemv.cu's K-quant scale decode as before 3ab7e4f, put back by docs/wip/old_k_scale.py) and
# stack (each family's winner of the screen, and early, the directory read before the PDL wait) against llama.cpp's
# tg on the same file. main's tokens should be old's (the same bits) and 07i's main digests.
# On a fresh box it synthesizes seed48 and runs main against llama.cpp alone (no test has passed there).
#   run: bash docs/wip/gpu-call-46b.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
wait
at "synth"
touch /root/m/rcs46; cp /root/m/rcs46 $R/rcs; cat $R/rcs
ok() { grep -q "^$1 rc=0" $R/rcs; }
EARLY="from runner.backends.cuda.token_graph import DirectoryDecodeGraph
DirectoryDecodeGraph.EARLY_SERVE = True"
# The stack: each family's fastest resident arm in 46's screen (decode_arms46.json) that kept main's tokens and beat
# main by 1% or more (route18/route14/route4w, gateup6/gateup7, half, ahead/ahead4), then early if its tests passed.
STACK=$(screened_stack)
ok directory && ok early && STACK="$STACK
$EARLY"
echo "stack:$STACK" > $R/stack.txt
ARMS=(--ours "main=$DECODE")
# old: main's tree with gemv.cu as it was before 2026-12-08's branch-free K-quant scale decode (3ab7e4f)
rm -rf /tmp/oldtree && mkdir -p /tmp/oldtree && cp -a runner cuda /tmp/oldtree/ \
  && python3 docs/wip/old_k_scale.py /tmp/oldtree/cuda/gemv.cu && variant old "sys.path.insert(0, '/tmp/oldtree')"
[ -n "$STACK" ] && variant stack "$STACK"
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
