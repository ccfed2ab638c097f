#!/usr/bin/env bash
# Issue 20 (2026-12-07e: gpu-call-28 with the normed products added, its suite and its arm; 28 never ran, the
# market refused every start until this was written). From 2026-12-07d: main's end-to-end decode GPU suites under its new defaults (the
# keys split, fill overlap; gpu-call-27's, which did not run), the row-length GEMV layout's GPU test, then seed48's
# offloaded decode at 1k against llama.cpp's tg with arms main, rows (gemv.UNITS_FROM_ROW = 2048 and
# UNITS_WARPS = 4: the K 2048 products in the units layout at 4 warps, the K 512 expert down products in
# columns) and merged (attention_cuda.DECODE_MERGE: the keys split merges in its last blocks, a launch fewer a
# layer) and greedy (Engine.GREEDY_ON_DEVICE: the argmax on the device, two ints down instead of the 600 KB
# logits row: host time a token), each where its GPU tests passed, then resident arms alternated with what
# time is left.
# fused (cuda ops.FUSED_NORMS and FUSED_COMBINE: attention's norm inside the q, k, v launch, the MoE norm, router
# product and its ranking in one launch, the expert sum in the down products' launch: 189 of seed48's 625 graph
# nodes a token fewer, the same bits). Main now also walks the
# slot directory in shared memory (the serve kernel's chain of dependent loads: 10 us a layer at 0 misses on
# 2026-12-07b): its GPU test runs with the suites, and bench_directory_cuda times it against the walk in global
# memory (docs/wip/slot_directory_global.cu, main's kernel before) before the head-to-head.
#   run: bash docs/wip/gpu-call-29.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
suite() {  # NAME FILES...: one pytest process until 190 s into the call
  local name=$1; shift
  (timeout $(left 190) python3 -m pytest -q "$@" > $R/pytest_$name.log 2>&1; echo "$name rc=$?" >> $R/rcs) &
}
suite graphs tests/test_decode_segments_cuda.py tests/test_fused_decode_cuda.py tests/test_graph_survival_cuda.py
suite engine tests/test_engine_cuda.py tests/test_nextn_graph_cuda.py
suite rows tests/test_gemv_cuda.py -k "long_rows or two_passes"
suite merged tests/test_attention_cuda.py -k "merged"
suite fused tests/test_fused_launches_cuda.py
suite directory tests/test_slot_directory_cuda.py
suite greedy tests/test_greedy_cuda.py tests/test_engine_cuda.py -k "greedy_on_the_device or index or ties or non_finite"
wait
cat $R/rcs; for f in $R/pytest_*.log; do echo "$f: $(tail -1 $f)"; grep -m5 "^FAILED" $f; done
directory() {  # NAME: bench_directory_cuda on the kernel cuda/slot_directory.cu holds now
  timeout $(left 250) python3 -m scripts.bench.bench_directory_cuda --repeat 15 --out $R/directory_$1.json \
    > $R/directory_$1.log 2>&1; at "directory $1 rc=$?"; tail -3 $R/directory_$1.log
}
directory shared
cp cuda/slot_directory.cu /tmp/slot_directory_shared.cu && cp docs/wip/slot_directory_global.cu cuda/slot_directory.cu
directory global
cp /tmp/slot_directory_shared.cu cuda/slot_directory.cu
directory shared2
ROWS="import runner.backends.cuda.gemv as g
g.UNITS_FROM_ROW = 2048; g.UNITS_WARPS = 4"
MERGED="import runner.backends.cuda.attention as a
a.DECODE_MERGE = True"
GREEDY="from runner.engine.engine import Engine
Engine.GREEDY_ON_DEVICE = True"
FUSED="import runner.backends.cuda.ops as o
o.FUSED_NORMS = True; o.FUSED_COMBINE = True"
passed() { grep -q "^$1 rc=0" $R/rcs; }  # the suite NAME passed
ARMS=(--ours "main=$DECODE")
passed fused && variant fused "$FUSED"
passed rows && variant rows "$ROWS"
passed merged && variant merged "$MERGED"
passed greedy && variant greedy "$GREEDY"
h2h_decode1k "${ARMS[@]}"
resident() {  # NAME PYTHON: bench_resident_cuda after PYTHON
  timeout $(left 585) python3 -c "
import runpy, sys
$2
sys.argv = ['bench_resident_cuda', '$M', '--out', '$R/resident_$1.$SECONDS.json', '--runs', '3',
            '--decode-contexts', '1024', '--decode-tokens', '32', '--prefill-lengths', '2048']
runpy.run_module('scripts.bench.bench_resident_cuda', run_name='__main__')" >> $R/resident_$1.log 2>&1
  at "resident $1 rc=$?"
}
for round in 1 2; do
  [ $(left 560) -gt 0 ] && resident main "" && resident fused "$FUSED" && resident rows "$ROWS"
done
cd $OUT && tar czf r.tgz r && rm -rf r
