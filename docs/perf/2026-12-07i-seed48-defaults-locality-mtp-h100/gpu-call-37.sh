#!/usr/bin/env bash
# Issue 20 item 5, MTP that pays, on the shape it is for (2026-12-07f queued it): 2026-12-07f's sweep (gpu-call-5)
# found MTP slower even at oracle acceptance on the demo model and seed8, where a NextN block is 1/8 of the layers
# or more (a draft step cost 0.6 to 0.8 of a decode step) and a 2-row verify cost 1.55 steps offloaded. On seed48
# a draft step is one layer of 48 plus the LM head; the verify's extra misses should decide it. bench_mtp on
# seed48 offloaded at 150 slots (the file's own router: random weights route near-uniformly, so the hit rate is
# a pessimist's) with oracle arms and forced acceptance 0.5, 0.7, 0.9 at depth 1 and 3 (seed48's drafts from
# random weights are never right: only forced acceptance says what trained weights would get).
#   run: bash docs/wip/gpu-call-37.sh    carry: [".whl"]    timeout_s 600
source docs/wip/device-env.sh
setup_box
seed48
wait
at "synth"
for depth in 1 3; do
  timeout $(left $([ $depth = 1 ] && echo 330 || echo 585)) python3 -m scripts.bench.bench_mtp $M --slots 150 \
    --context 1024 --tokens 64 --runs 3 --accept 0.5,0.7,0.9 --forced-depth $depth \
    --out $R/mtp_seed48_depth$depth.json > $R/mtp_seed48_depth$depth.log 2>&1
  at "mtp seed48 depth $depth rc=$?"; tail -1 $R/mtp_seed48_depth$depth.log | cut -c1-600
done
cd $OUT && tar czf r.tgz r && rm -rf r
