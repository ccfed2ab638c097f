#!/usr/bin/env bash
# gpu-call-46.sh and 46b in one 600 s call, for a session whose device time holds one call (2026-12-08: five refused
# starts left 989 s): 46's tests until 200 s and its resident screen (4 rounds) until 330 s, then 46b's offloaded
# head-to-head (main, old, stack against llama.cpp) until 585 s. One clock (T0) and one results folder for both.
#   run: bash docs/wip/gpu-call-51.sh    carry: [".whl", ".llcuda"]    timeout_s 600
export T0=$(date +%s) TESTS_BY=200 ARMS_BY=330 ROUNDS=4 KEEP_R=1
bash docs/wip/gpu-call-46.sh
bash docs/wip/gpu-call-46b.sh
