#!/usr/bin/env bash
# Issue 20 (2026-12-07e): the fused launches apart. gpu-call-29 measured FUSED_NORMS and FUSED_COMBINE only
# together (resident seed48: 625 -> 436 nodes a token, 4.97 -> 5.02 ms of GPU). Here resident seed48 with each
# alone against main, alternated, one process an arm a round: graph nodes and GPU ms a token
# (bench_resident_cuda's decode_overhead). If one wins by more than the rounds' spread, it gets an offloaded
# head-to-head next. About 5 minutes; no llama.cpp.
#   run: CALL_S=330 bash docs/wip/gpu-call-31.sh    carry: [".whl"]    timeout_s 330
source docs/wip/device-env.sh
setup_box
seed48
wait
NORMS="import runner.backends.cuda.ops as o
o.FUSED_NORMS = True"
COMBINE="import runner.backends.cuda.ops as o
o.FUSED_COMBINE = True"
for round in 1 2 3; do
  [ $(left 540) -gt 0 ] && resident main "" && resident norms "$NORMS" && resident combine "$COMBINE"
done
cd $OUT && tar czf r.tgz r && rm -rf r
