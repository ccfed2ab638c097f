#!/usr/bin/env bash
# Issue 20 (2026-12-07e; replaces gpu-call-28, which never ran: the market refused every start).
# 1. GPU suites in parallel until 190 s: main's end-to-end decode suites under the 2026-12-07d defaults (the keys
#    split and fill overlap, whose combination has not run on a GPU), main's slot directory walked in shared
#    memory, and each candidate's tests.
# 2. bench_directory_cuda on that walk and on the global walk before it (docs/wip/slot_directory_global.cu,
#    swapped in here), alternated.
# 3. seed48's offloaded decode at 1k against llama.cpp's tg on the same file, arm main and, where its suite
#    passed, each candidate: fused (cuda ops.FUSED_NORMS and FUSED_COMBINE: the norms inside the products that
#    read them, the router's top-k in its product's last block, the expert sum in the down products' last
#    blocks: 189 of seed48's 625 graph nodes a token, the same bits), merged (attention_cuda.DECODE_MERGE: the
#    keys split merges in its last blocks, a launch fewer a layer), greedy (Engine.GREEDY_ON_DEVICE: the argmax
#    on the device, two ints down instead of the 600 KB logits row: host time a token).
# 4. Resident arms main and fused with the time left.
# gemv.UNITS_FROM_ROW (the rows arm of 28) waits: at 4 warps a block has fewer threads than seed48's 512
# experts, so the fused router would step aside, and the two would need a matrix of arms.
# Any length from 360 s (CALL_S, with timeout_s the same): suites until 160 s, the head-to-head until 25 s before
# the end; under 450 s only the arms main and fused.
#   run: CALL_S=480 bash docs/wip/gpu-call-29.sh    carry: [".whl", ".llcuda"]    timeout_s 480
source docs/wip/device-env.sh
by() { left $(( $1 + 600 - CALL_S )); }  # seconds left until $1 s into this call
setup_box; llama_cuda
seed48
suite() {  # NAME FILES...: one pytest process until 160 s into the call
  local name=$1; shift
  (timeout $(by 160) python3 -m pytest -q "$@" > $R/pytest_$name.log 2>&1; echo "$name rc=$?" >> $R/rcs) &
}
suite graphs tests/test_decode_segments_cuda.py tests/test_fused_decode_cuda.py tests/test_graph_survival_cuda.py
suite engine tests/test_engine_cuda.py tests/test_nextn_graph_cuda.py
suite merged tests/test_attention_cuda.py -k "merged"
suite fused tests/test_fused_launches_cuda.py -k "not decoding"
suite fused_e2e tests/test_fused_launches_cuda.py -k "decoding"
suite directory tests/test_slot_directory_cuda.py
suite greedy tests/test_greedy_cuda.py tests/test_engine_cuda.py -k "greedy_on_the_device or index or ties or non_finite"
wait
cat $R/rcs; for f in $R/pytest_*.log; do echo "$f: $(tail -1 $f)"; grep -m5 "^FAILED" $f; done
directory() {  # NAME: bench_directory_cuda on the kernel cuda/slot_directory.cu holds now
  timeout $(by 250) python3 -m scripts.bench.bench_directory_cuda --repeat 15 --out $R/directory_$1.json \
    > $R/directory_$1.log 2>&1; at "directory $1 rc=$?"; tail -3 $R/directory_$1.log
}
directory shared
cp cuda/slot_directory.cu /tmp/slot_directory_shared.cu && cp docs/wip/slot_directory_global.cu cuda/slot_directory.cu
directory global
cp /tmp/slot_directory_shared.cu cuda/slot_directory.cu
directory shared2
MERGED="import runner.backends.cuda.attention as a
a.DECODE_MERGE = True"
GREEDY="from runner.engine.engine import Engine
Engine.GREEDY_ON_DEVICE = True"
FUSED="import runner.backends.cuda.ops as o
o.FUSED_NORMS = True; o.FUSED_COMBINE = True"
passed() { grep -q "^$1 rc=0" $R/rcs; }  # the suite NAME passed
ARMS=(--ours "main=$DECODE")
passed fused && variant fused "$FUSED"
if [ $CALL_S -ge 450 ]; then
  passed merged && variant merged "$MERGED"
  passed greedy && variant greedy "$GREEDY"
fi
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
  [ $(left 560) -gt 0 ] && resident main "" && resident fused "$FUSED"
done
cd $OUT && tar czf r.tgz r && rm -rf r
