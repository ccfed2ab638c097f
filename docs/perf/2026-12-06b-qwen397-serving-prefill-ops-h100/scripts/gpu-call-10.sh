#!/usr/bin/env bash
# Issue 20 item 3 on seed8, right after gpu-call-8 on the warm box (or cold: setup_box synthesizes seed8):
# launches per decode token counted from the captured graphs (scripts/bench/graph_launches: segments,
# directory, resident; segments and resident again with rope-store reverted, the "before" of item 3), seed8
# prompts op by op at 32k and 8k with the pool and moe host-step figures (scripts/bench/prefill_ops), then a
# token's GPU time op by op, eager (scripts/bench/decode_ops); about 5 minutes.
#   run: bash docs/wip/gpu-call-10.sh        carry: [".whl"]
# PHASE=tail (a short call at a session's end, LIMIT seconds): seed8's 32k prompt op by op (the host stall of
# experts_by_recency gone, 4045dac; one address upload a moe call, b3ec685), then the resident arms that failed
# on 2026-12-06 (launches with and without rope-store, decode op by op), each only if its time is left.
source docs/wip/device-env.sh
setup_box; wait
M=/root/m/seed8.gguf
if [ "${PHASE:-}" = tail ]; then
  L=${LIMIT:-240}
  timeout $(left $L) python3 -m scripts.bench.prefill_ops $M --tokens 32768 --warm-fill staging \
    --out $R/prefill_ops_seed8_32768.json > $R/prefill_ops_32768.log 2>&1; at "prefill_ops 32768 rc=$?"
  [ $(left $L) -gt 40 ] && { timeout $(left $L) python3 -m scripts.bench.graph_launches $M --decode-graph segments \
    --slots resident --context 1024 --out $R/launches_segments_resident.json > $R/launches_segments_resident.log 2>&1
    at "graph_launches segments resident rc=$?"; tail -2 $R/launches_segments_resident.log; }
  [ $(left $L) -gt 40 ] && { timeout $(left $L) python3 -m scripts.bench.decode_ops $M --slots resident --context 1024 \
    --tokens 64 --out $R/decode_ops_resident.json > $R/decode_ops_resident.log 2>&1; at "decode_ops resident rc=$?"
    tail -3 $R/decode_ops_resident.log; }
  cd $OUT && tar czf r.tgz r && rm -rf r; exit
fi
for arm in "segments 150" "directory 150" "segments resident"; do  # resident: one whole-step DecodeGraph
  set -- $arm
  timeout $(left 300) python3 -m scripts.bench.graph_launches $M --decode-graph $1 --slots $2 --context 1024 \
    --out $R/launches_$1_$2.json > $R/launches_$1_$2.log 2>&1
  at "graph_launches $1 $2 rc=$?"; tail -2 $R/launches_$1_$2.log
done
# before the fused decode ops (rope-store, 3c7f2c1, reverted in the tree for these two processes only)
if git show --format= 3c7f2c1 > /tmp/rope.patch && git apply -R /tmp/rope.patch; then
  for slots in 150 resident; do
    timeout $(left 330) python3 -m scripts.bench.graph_launches $M --decode-graph segments --slots $slots \
      --context 1024 --out $R/launches_before_rope_$slots.json > $R/launches_before_rope_$slots.log 2>&1
    at "graph_launches before rope-store $slots rc=$?"; tail -1 $R/launches_before_rope_$slots.log
  done
  git apply /tmp/rope.patch
else echo "rope-store not reverted: no before arms"; fi
for n in 32768 8192; do  # issue 19: where seed8's moe spends ~11 ms a call of host time at 32k (pool, argsort, asarray?)
  timeout $(left 400) python3 -m scripts.bench.prefill_ops $M --tokens $n --warm-fill staging \
    --out $R/prefill_ops_seed8_$n.json > $R/prefill_ops_$n.log 2>&1; at "prefill_ops $n rc=$?"; tail -2 $R/prefill_ops_$n.log
done
for slots in 150 resident; do
  [ $(left 560) -lt 40 ] && break
  timeout $(left 580) python3 -m scripts.bench.decode_ops $M --slots $slots --context 1024 --tokens 64 \
    --out $R/decode_ops_$slots.json > $R/decode_ops_$slots.log 2>&1; at "decode_ops $slots rc=$?"; tail -3 $R/decode_ops_$slots.log
done
cd $OUT && tar czf r.tgz r && rm -rf r
