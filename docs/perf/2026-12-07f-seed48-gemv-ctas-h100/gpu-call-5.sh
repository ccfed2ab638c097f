#!/usr/bin/env bash
# Issue 20 item 5, MTP that pays: the cost model (verify and draft step costs from the oracle arms,
# speedup by acceptance, break-even per depth) and forced-acceptance arms (0.5, 0.7, 0.9 per position at
# depth 3) checked end to end against it, on the demo model resident and on seed8 offloaded (150 slots,
# 24 GiB) under the calibrated qwen3-30b-a3b locality routing (labelled synthetic in the JSON). From a cold
# or warm box (setup_box in device-env.sh), tree at main (segmented
# decode graphs; the directory graphs are not wired into bench_mtp).
#   run: bash docs/wip/gpu-call-5.sh        carry: [".whl"]
source docs/wip/device-env.sh
setup_box; wait
timeout 200 python3 -m scripts.bench.bench_mtp runner/data/demo.gguf --slots resident --context 768 --tokens 128 \
  --runs 5 --accept 0.5,0.7,0.9 --out $R/mtp_demo_resident.json > $R/mtp_demo_resident.log 2>&1
at "mtp demo resident rc=$?"; tail -1 $R/mtp_demo_resident.log | cut -c1-600
LEFT=$(( 560 - ($(date +%s) - T0) ))
timeout $LEFT python3 -m scripts.bench.bench_mtp /root/m/seed8.gguf --slots 150 --context 1024 --tokens 128 --runs 5 \
  --routing locality-qwen3-30b-a3b --accept 0.5,0.7,0.9 --out $R/mtp_seed8_150_locality.json \
  > $R/mtp_seed8_150_locality.log 2>&1
at "mtp seed8 rc=$?"; tail -1 $R/mtp_seed8_150_locality.log | cut -c1-600
cd $OUT && tar czf r.tgz r && rm -rf r
