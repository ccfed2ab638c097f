#!/usr/bin/env bash
# The least a session left with 449 s of device time can check (2026-12-07g, after eight refused starts): the GPU
# tests of main's changed decode path (DecodeGraph.enqueue, GraphBatch's pinned slots, greedy_f32's token_out)
# and of the new flags (GREEDY_AHEAD, TOP_K_ON_DEVICE, SPLIT_FILLS, COLUMNS_PER_THREAD at Q4_K), in parallel on the
# demo and seed8 models, then the fill kernel alone at FILL_UNROLL 1 and 4. No seed48, no llama.cpp.
#   run: bash docs/wip/gpu-call-41.sh    carry: [".whl"]    timeout_s 300
source docs/wip/device-env.sh
setup_box
(timeout $(left 215) python3 -m pytest -q tests/test_greedy_chain_cuda.py tests/test_top_k_cuda.py \
  > $R/pytest_chain.log 2>&1; echo "chain rc=$?" >> $R/rcs) &
(timeout $(left 215) python3 -m pytest -q tests/test_graph_survival_cuda.py tests/test_nextn_graph_cuda.py \
  tests/test_decode_segments_cuda.py > $R/pytest_graphs.log 2>&1; echo "graphs rc=$?" >> $R/rcs) &
(timeout $(left 215) python3 -m pytest -q tests/test_gemv_cuda.py -k "columns_layout_gives and Q4_K or one_pass" \
  > $R/pytest_shapes.log 2>&1; echo "shapes rc=$?" >> $R/rcs) &
wait
at "tests"; cat $R/rcs; for f in chain graphs shapes; do tail -n 2 $R/pytest_$f.log; done
for u in 1 4; do
  timeout $(left 280) python3 -c "
import runpy, sys
import runner.backends.cuda.slot_directory as sd
sd.FILL_UNROLL = $u
sys.argv = ['bench_directory_cuda', '--repeat', '20', '--out', '$R/directory_unroll$u.json']
runpy.run_module('scripts.bench.bench_directory_cuda', run_name='__main__')" > $R/directory_unroll$u.log 2>&1
  at "directory unroll $u rc=$?"; grep -E '"misses": (1|10),' $R/directory_unroll$u.log | cut -c1-200
done
cd $OUT && tar czf r.tgz r && rm -rf r
