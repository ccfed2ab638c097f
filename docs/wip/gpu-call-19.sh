#!/usr/bin/env bash
# Issue 20 item 3, the small GEMVs (2026-12-07b): main (linears, residual and attn-residual merged) on the GPU, and
# the units layout at fewer warps a block (gemv.py UNITS_WARPS: more blocks on the SMs, the same bits):
# - main's GPU suites for what the merge touched (gemv, gemv_multi, the decode graphs, the engine), with the new
#   test that the units layout's bits do not depend on its warps a block;
# - gemv_latency_cuda: seed48's products inside one graph, columns vs units at 16, 8, 4 and 2 warps of 2 columns
#   and 8 and 4 warps of 1 column;
# - resident seed48 (bench_resident_cuda), arms alternated, 2 processes each (ROUNDS): main, Q4_K and Q6_K in the
#   units layout at 4 and 8 warps of 2 columns and 4 warps of 1 (the GEMV bits change with the layout; every path
#   shares them).
#   run: CALL_S=330 bash docs/wip/gpu-call-19.sh    carry: [".whl"]    timeout_s 330 (ROUNDS=3 and 600 s if time allows)
source docs/wip/device-env.sh
setup_box
seed48
timeout $(left 400) python3 -m pytest -q tests/test_gemv_cuda.py -k units_layout > $R/pytest_units.log 2>&1
at "pytest units rc=$?"; tail -1 $R/pytest_units.log
timeout $(left 400) python3 -m pytest -q tests/test_gemv_multi_cuda.py tests/test_decode_segments_cuda.py > $R/pytest_main.log 2>&1
at "pytest main rc=$?"; tail -3 $R/pytest_main.log
timeout $(left 430) python3 -m scripts.bench.gemv_latency_cuda --out $R/gemv_latency.json > $R/gemv_latency.log 2>&1
at "gemv latency rc=$?"
# ncu (Firecracker boxes read counters; --clock-control none): one q product (2048 x 2048 Q4_K, one row) in the
# columns layout, the units layout at 16 and at 4 warps, then the first decode attention split and merge of
# bench_attention_cuda's seed shape: stall reasons and issue rates
NCU="ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --csv"
cat > /tmp/ncu_gemv.py <<'PY'
import cupy as cp
from gguf.constants import GGMLQuantizationType as QT
import runner.backends.cuda.gemv as g
from scripts.bench.bench_gemv_cuda import random_bytes
w, x = random_bytes(2048, 2048, QT.Q4_K), cp.random.standard_normal((1, 2048), dtype=cp.float32)
for layout, warps, cols in (("columns", 16, 2), ("units", 16, 2), ("units", 4, 2), ("units", 4, 1)):  # in this order
    g.LAYOUTS[QT.Q4_K], g.UNITS_WARPS, g.UNITS_WARP_COLUMNS = layout, warps, cols
    g.gemv(x, w, QT.Q4_K, 2048)
cp.cuda.Device().synchronize()
PY
which ncu > $R/ncu_which.log 2>&1 && PYTHONPATH=$PYTHONPATH:$(pwd) timeout $(left 450) $NCU -k regex:gemv_r1 python3 /tmp/ncu_gemv.py \
  > $R/ncu_gemv.csv 2> $R/ncu_gemv.err
at "ncu gemv rc=$?"
timeout $(left 470) $NCU -k regex:attn_decode -c 2 python3 -m scripts.bench.bench_attention_cuda --shape seed --decode-only \
  --repeat 20 --out /tmp/ncu_attn.json > $R/ncu_attn.csv 2> $R/ncu_attn.err
at "ncu attention rc=$?"
wait
arm() {  # NAME LAYOUT WARPS COLUMNS: bench_resident_cuda, Q4_K and Q6_K in LAYOUT at WARPS warps of COLUMNS a block
  timeout $(left 585) python3 -c "
import runpy, sys
from gguf.constants import GGMLQuantizationType as QT
import runner.backends.cuda.gemv as g
g.LAYOUTS[QT.Q4_K] = g.LAYOUTS[QT.Q6_K] = '$2'; g.UNITS_WARPS = $3; g.UNITS_WARP_COLUMNS = $4
sys.argv = ['bench_resident_cuda', '$M', '--out', '$R/resident_$1.$SECONDS.json', '--runs', '3',
            '--decode-contexts', '1024', '--decode-tokens', '32', '--prefill-lengths', '2048']
runpy.run_module('scripts.bench.bench_resident_cuda', run_name='__main__')" >> $R/resident_$1.log 2>&1
  at "resident $1 rc=$?"
}
for round in $(seq ${ROUNDS:-2}); do arm main columns 16 2; arm units4 units 4 2; arm units8 units 8 2; arm units4c1 units 4 1; done
python3 - $R <<'PY'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("resident_*.json")):
    o = json.loads(f.read_text())["decode_overhead"]
    print(f.name, o["graph_nodes_per_token"], round(o["graph_gpu_ms_per_token"]["median"], 3))
PY
cut -c1-150 $R/gemv_latency.log
cd $OUT && tar czf r.tgz r && rm -rf r
