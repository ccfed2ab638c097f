#!/usr/bin/env bash
# The least a session left with 449 s of device time can check (2026-12-07g, after eight refused starts): the GPU
# tests of main's changed decode path (DecodeGraph.enqueue, GraphBatch's pinned slots, greedy_f32's token_out)
# and of the new flags (GREEDY_AHEAD, TOP_K_ON_DEVICE, SPLIT_FILLS, COLUMNS_PER_THREAD at Q4_K), in parallel on the
# demo and seed8 models, then the fill kernel alone at FILL_UNROLL 1 and 4. No seed48, no llama.cpp.
#   run: bash docs/wip/gpu-call-41.sh    carry: [".whl"]    timeout_s 300
source docs/wip/device-env.sh
setup_box
decode_path_tests 215 "columns_layout_gives and Q4_K or one_pass"
fill_bench 280 20 1
cd $OUT && tar czf r.tgz r && rm -rf r
