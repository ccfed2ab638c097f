#!/usr/bin/env bash
# Issue 20 (2026-12-07i): the prefetch a layer ahead with its guess off the main stream. 07i's prefetch5 raised hits
# 86.5 -> 90% but lost 0.45 ms a token: each guess was a second normed router on the main stream ahead of the
# layer's own (ncu: 16 us a layer). Now DirectoryDecodeGraph runs it on a stream of its own (its own last-block
# counter: ROUTER_BESIDE) from the point the layer's input is ready, and the walk on the fill stream waits for its
# event; the guesses land in buffers that outlive the step. While seed48 synthesizes: the prefetch GPU suite (its
# tokens must be main's). Then seed48 offloaded at 1k: main, prefetch2, prefetch5 and prefetch10 against
# llama.cpp's tg. Deadlines are seconds into a 600 s call (device-env.sh's `left`).
#   run: bash docs/wip/gpu-call-48.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
(timeout $(left 200) python3 -m pytest -q tests/test_prefetch_cuda.py tests/test_fused_launches_cuda.py -k \
  "prefetch or route" > $R/pytest_prefetch.log 2>&1; echo "prefetch rc=$?" >> $R/rcs) &
wait
at "tests and synth"; cat $R/rcs; tail -n 2 $R/pytest_prefetch.log
ARMS=(--ours "main=$DECODE")
if grep -q "^prefetch rc=0" $R/rcs; then
  for d in 2 5 10; do
    variant prefetch$d "from runner.backends.cuda.token_graph import DirectoryDecodeGraph
DirectoryDecodeGraph.PREFETCH_DEPTH = $d"
  done
fi
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
