#!/usr/bin/env bash
# Issue 20 (2026-12-07e): why seed48's decode products take 3 to 5 times their read (expert_gate_up 23 us for 10
# pairs of 1.2 MB, a 2048 x 2048 Q4_K gemv 7.8 us, "bound by the instruction path" by the 2026-12-07b probes, never
# looked at with counters): ncu's full set on bench_gemv_cuda --seed-shapes' kernels (the gemv_r1 products, the
# expert products at 10 pairs, gemv_multi at 1 row), a few launches each, and its source-level SASS counts for
# expert_gate_up. About 3 minutes; no model, no llama.cpp.
#   run: bash docs/wip/gpu-call-30.sh    carry: [".whl"]    timeout_s 360
source docs/wip/device-env.sh
CALL_S=${CALL_S:-360}
setup_box
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
echo "ncu: ${NCU:-none}"; [ -n "$NCU" ] || exit 0
python3 -m scripts.bench.bench_gemv_cuda --seed-shapes --quick --repeat 3 --out $R/gemv_seed.json > $R/gemv_seed.log 2>&1
at "bench rc=$?"
# each kernel name alone: its first launch warms up (skipped), the next two are profiled (the gemv_r1 pair is
# the 2048 x 2048 Q4_K product, the first case; expert_gate_up's the 10-pair one)
for k in expert_gate_up gemv_r1 expert_gemv gemv_multi_r1; do
  [ $(left 300) -gt 0 ] || break
  timeout $(left 330) $NCU --set full --import-source yes --kernel-name regex:"^$k\$" --launch-skip 1 --launch-count 2 \
    --clock-control none -o $R/ncu_$k python3 -m scripts.bench.bench_gemv_cuda --seed-shapes --quick --repeat 1 \
    > $R/ncu_$k.log 2>&1
  at "ncu $k rc=$?"
  [ -f $R/ncu_$k.ncu-rep ] && $NCU --import $R/ncu_$k.ncu-rep --csv --page details > $R/ncu_$k.csv 2> /dev/null
done
ls -la $R; tail -n 3 $R/ncu_*.log
cd $OUT && tar czf r.tgz r && rm -rf r
