#!/usr/bin/env bash
# Main's GPU suites that run decode end to end, after the keys split became the default and fill-overlap landed
# (2026-12-07d): decode graphs (segments, directory, fused, surviving the phase transaction), NextN graphs,
# the slot directory, offload and engine, in three pytest processes side by side.
#   run: CALL_S=<timeout_s> bash docs/wip/gpu-call-27.sh    carry: [".whl"]
source docs/wip/device-env.sh
setup_box
suite() {  # NAME FILES...: one pytest process until 20 s before the call's end
  local name=$1; shift
  (timeout $(left 580) python3 -m pytest -q "$@" > $R/pytest_$name.log 2>&1; echo "$name rc=$?" >> $R/rcs) &
}
suite graphs tests/test_decode_segments_cuda.py tests/test_fused_decode_cuda.py tests/test_graph_survival_cuda.py
suite engine tests/test_engine_cuda.py tests/test_nextn_graph_cuda.py
suite offload tests/test_slot_directory_cuda.py tests/test_offload_cuda.py tests/test_attention_cuda.py -k "not prefill"
wait
cat $R/rcs; for f in $R/pytest_*.log; do echo "$f: $(tail -1 $f)"; grep -m5 "^FAILED" $f; done
cd $OUT && tar czf r.tgz r && rm -rf r
