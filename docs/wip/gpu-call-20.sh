#!/usr/bin/env bash
# Issue 20's headline at main (2026-12-07b): seed48 decode at context 1k, 150 slots, 24 GiB, 128 tokens, directory
# graphs, against llama.cpp's tg on the same file; 3 rounds of 2 runs. OLD_LAYOUT=1 adds an arm with Q4_K and Q6_K
# back in the columns layout (the A/B of the layout change, same rounds).
#   run: bash docs/wip/gpu-call-20.sh    carry: [".whl", ".llcuda"]    (about 6 to 8 minutes; CALL_S if shorter)
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
wait
OLD="python3 -c 'import runpy, sys; from gguf.constants import GGMLQuantizationType as QT; import runner.backends.cuda.gemv as g; g.LAYOUTS[QT.Q4_K] = g.LAYOUTS[QT.Q6_K] = \"columns\"; sys.argv[0] = \"runner\"; runpy.run_module(\"runner.cli\", run_name=\"__main__\")'"
EXTRA=()
[ "${OLD_LAYOUT:-0}" = 1 ] && EXTRA=(--ours "columns=$DECODE" --ours-runner "columns=$OLD")
h2h_decode1k --ours "main=$DECODE" "${EXTRA[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
