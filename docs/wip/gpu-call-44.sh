#!/usr/bin/env bash
# Issue 20 (2026-12-07h): gpu-call-39's head-to-head again, for the warm box right after it (seed48 is on its disk,
# the tests' return codes in /root/m/rcs), so every arm gets at least three processes across the two calls. On a
# fresh box it synthesizes seed48 first and runs only the arms whose tests it runs itself. prefetch5: PREFETCH_DEPTH 5
# with the serve waiting only for the prefetch's walk (2026-12-07h; 07f's prefetch5 waited for its fills too).
#   run: bash docs/wip/gpu-call-44.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
if [ -s /root/m/rcs ]; then cp /root/m/rcs $R/rcs; else decode_path_tests 230 "columns_layout_gives or one_pass"; fi
wait
at "ready"; cat $R/rcs
ARMS=(--ours "main=$DECODE")
grep -q "^pdl rc=0" $R/rcs && variant pdl "import runner.backends.cuda.launch as l
l.PDL = True"
grep -q "^graphs rc=0" $R/rcs && variant split "from runner.backends.cuda.token_graph import DirectoryDecodeGraph
DirectoryDecodeGraph.SPLIT_FILLS = True"
grep -q "^shapes rc=0" $R/rcs && variant cols128 "import runner.backends.cuda.gemv as g
g.COLUMNS_THREADS = 128"
grep -q "^graphs rc=0" $R/rcs && variant prefetch5 "from runner.backends.cuda.token_graph import DirectoryDecodeGraph
DirectoryDecodeGraph.PREFETCH_DEPTH = 5"
grep -q "^chain rc=0" $R/rcs && variant ahead "from runner.engine.engine import Engine
Engine.GREEDY_AHEAD = True"
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
