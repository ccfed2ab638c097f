#!/usr/bin/env bash
# Issue 20 (2026-12-08): why the decode kernels run at a tenth of HBM bandwidth. 07i's kernel table (ncu, resident
# seed48 at 1k) has q/k/v (3.5 MB of Q4_K) at 15.2 us a layer, the router (1 MB of float32) at 16.1, the gate-up
# (14 MB) at 22.7, attention's keys (2.4 MB of float16 K/V) at 18.4: latency, not bytes. This call asks ncu why:
# the full section set (speed of light, occupancy, warp stall reasons, memory workload, source counters) for each
# decode kernel of two middle layers of one resident token, printed as text and as CSV. Then the kernel table with
# every knob 2026-12-07i and 08 added switched on (router, gate-up, down and attention), to rank them kernel by
# kernel, and, time left, the attention sweep over decode split sizes at the seed shape.
#   run: bash docs/wip/gpu-call-49.sh    carry: [".whl"]    timeout_s 600
source docs/wip/device-env.sh
setup_box
seed48
wait
at "synth"
NCU=$(ncu_path)
echo "ncu: ${NCU:-none}"; [ -n "$NCU" ] || { cd $OUT && tar czf r.tgz r && rm -rf r; exit 0; }
# 10 decode kernels a layer (07i's table): skip the first 20 layers' launches of the named kernels, keep 2 layers'
KERNELS="regex:expert_gate_up|attn_decode_keys|attn_decode_combine|gemv_norm_route|gemv_multi_norm|expert_gemv|gemv_r1|rope_store|combine_f32|pair_expert_pointers"
timeout $(left 300) $NCU --profile-from-start off --graph-profiling node --set full --import-source no \
  --kernel-name "$KERNELS" --launch-skip 200 --launch-count 20 --cache-control none --clock-control none \
  -o $R/detail python3 -c "
import runpy, sys
sys.argv = ['bench_resident_cuda', '$M', '--out', '$R/resident_ncu.json', '--runs', '1', '--decode-contexts', '1024',
            '--decode-tokens', '4', '--prefill-lengths', '512', '--profile-tokens', '1']
runpy.run_module('scripts.bench.bench_resident_cuda', run_name='__main__')" > $R/ncu_run.log 2>&1
at "ncu rc=$?"; tail -3 $R/ncu_run.log
if [ -s $R/detail.ncu-rep ]; then
  $NCU --import $R/detail.ncu-rep --page details > $R/details.txt 2>&1
  $NCU --import $R/detail.ncu-rep --page raw --csv > $R/raw.csv 2>&1
  $NCU --import $R/detail.ncu-rep --page source --csv --print-source sass > $R/source.csv 2>&1
  at "ncu export"; ls -la $R; rm -f $R/detail.ncu-rep  # the text pages carry it; the report is tens of MB
fi
# The kernel table (gpu-call-38's) with every new knob on, to set beside 07i's table kernel by kernel
KNOBS="import runner.backends.cuda.gemv as g, runner.backends.cuda.attention as a
g.ROUTE_WARP_COLUMNS, g.ROUTE_LOAD_AHEAD, g.ROUTE_TILE_WARPS = 1, 8, 4
g.GATE_UP_MIN_BLOCKS, g.EXPERT_HALF_SLICES = 6, True
a.DEC_K_AHEAD, a.DEC_V_AHEAD = 16, 8"
timeout $(left 480) $NCU --profile-from-start off --graph-profiling node --metrics gpu__time_duration.sum \
  --cache-control none --clock-control none --csv --page raw --print-units base python3 -c "
import runpy, sys
$KNOBS
sys.argv = ['bench_resident_cuda', '$M', '--out', '$R/resident_knobs.json', '--runs', '1', '--decode-contexts', '1024',
            '--decode-tokens', '8', '--prefill-lengths', '512', '--profile-tokens', '4']
runpy.run_module('scripts.bench.bench_resident_cuda', run_name='__main__')" > $R/ncu_knobs.csv 2> $R/ncu_knobs.err
at "ncu knobs rc=$?"
python3 -m scripts.bench.kernel_table $R/ncu_knobs.csv --tokens 4 --label "seed48 resident 1k, new knobs" \
  --out $R/kernels_knobs.json 2>&1 | tail -n 18
timeout $(left 585) python3 -m scripts.bench.bench_attention_cuda --shape seed --decode-only \
  --kv-chunks 32,64,128,256 --out $R/attention_chunks.json > $R/attention_chunks.log 2>&1
at "attention chunks rc=$?"; tail -8 $R/attention_chunks.log
cd $OUT && tar czf r.tgz r && rm -rf r
