#!/usr/bin/env bash
# Issue 20 (2026-12-07e): why seed48's decode products take 3 to 5 times their read (expert_gate_up 23 us for 10
# pairs of 1.2 MB, a 2048 x 2048 Q4_K gemv 7.8 us, "bound by the instruction path" by the 2026-12-07b probes, never
# looked at with counters): ncu's full set on bench_gemv_cuda --seed-shapes' kernels (the gemv_r1 products, the
# expert products at 10 pairs, gemv_multi at 1 row), a few launches each, and its source-level SASS counts for
# expert_gate_up. First, the two GPU tests fixed after gpu-call-29 without a rerun (the NextN draft graphs' kind
# under offload, now directory graphs; the fused launches' offloaded MTP decoding with decode_batch 4). About 7
# minutes; no seed48, no llama.cpp.
#   run: CALL_S=420 bash docs/wip/gpu-call-30.sh    carry: [".whl"]    timeout_s 420
source docs/wip/device-env.sh
setup_box
timeout $(left 300) python3 -m pytest -q tests/test_nextn_graph_cuda.py tests/test_fused_launches_cuda.py -k \
  "draft_graphs or decoding" > $R/pytest_fixed.log 2>&1; at "fixed tests rc=$?"; tail -3 $R/pytest_fixed.log
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
echo "ncu: ${NCU:-none}"; [ -n "$NCU" ] || exit 0
python3 -m scripts.bench.bench_gemv_cuda --seed-shapes --quick --repeat 20 --out $R/gemv_seed.json > $R/gemv_seed.log 2>&1
at "bench rc=$?"
# each kernel name alone: its first launch warms up (skipped), the next two are profiled (the gemv_r1 pair is
# the 2048 x 2048 Q4_K product, the first case; expert_gate_up's the 10-pair one)
for k in expert_gate_up gemv_r1 expert_gemv gemv_multi_r1; do
  [ $(left 520) -gt 0 ] || break
  timeout $(left 580) $NCU --set full --import-source yes --kernel-name regex:"^$k\$" --launch-skip 1 --launch-count 2 \
    --clock-control none -o $R/ncu_$k python3 -m scripts.bench.bench_gemv_cuda --seed-shapes --quick --repeat 20 \
    > $R/ncu_$k.log 2>&1
  at "ncu $k rc=$?"
  [ -f $R/ncu_$k.ncu-rep ] && $NCU --import $R/ncu_$k.ncu-rep --csv --page details > $R/ncu_$k.csv 2> /dev/null
done
ls -la $R; tail -n 3 $R/ncu_*.log
cd $OUT && tar czf r.tgz r && rm -rf r
