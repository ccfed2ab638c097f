#!/usr/bin/env bash
# The third call of 2026-12-07h, as sent inline (run: CALL_S=370 bash <this>, carry [".whl", ".llcuda"], timeout_s
# 370, on the warm box after gpu-call-39 and gpu-call-42): main, pdl and stack (PDL + SPLIT_FILLS + GREEDY_AHEAD)
# against llama.cpp's tg on seed48 at 1k, 3 rounds of 2 runs.
source docs/wip/device-env.sh; setup_box; llama_cuda; seed48; wait; ARMS=(--ours "main=$DECODE"); variant pdl "import runner.backends.cuda.launch as l
l.PDL = True"; variant stack "import runner.backends.cuda.launch as l
l.PDL = True
from runner.backends.cuda.token_graph import DirectoryDecodeGraph
DirectoryDecodeGraph.SPLIT_FILLS = True
from runner.engine.engine import Engine
Engine.GREEDY_AHEAD = True"; h2h_decode1k "${ARMS[@]}"; cd $OUT && tar czf r.tgz r && rm -rf r
