#!/usr/bin/env bash
# Issue 20's pending kernel candidates on the GPU (2026-12-07d), no llama.cpp (gpu-call-26 runs the head-to-head):
# - the three candidates' GPU tests side by side while seed48 synthesizes: fill-overlap.patch's (on a patched
#   copy), decode attention's keys split, the units GEMV layout's bits at any warps a block;
# - bench_attention_cuda at the seed shape: decode split chunks of 32, 64 and 128 keys, tiles and keys splits;
# - resident seed48 (bench_resident_cuda, graph GPU ms a token), arms alternated, ROUNDS processes each: main,
#   keys split, Q4_K and Q6_K in the units layout at 4 and 8 warps of 2 columns, and both (keys + units4);
# - main's merged GPU suites (gemv_multi, segments) and gemv_latency with what time is left.
#   run: bash docs/wip/gpu-call-25.sh    carry: [".whl", ".whl-extra"]    timeout_s 600
#   (on a box warm from gpu-call-26: SKIP_TESTS=1 CALL_S=<timeout_s>, with ROUNDS=1 below about 450 s)
source docs/wip/device-env.sh
setup_box
seed48
if [ "${SKIP_TESTS:-0}" != 1 ]; then  # SKIP_TESTS=1: a warm box where gpu-call-26 ran them
  rm -rf /tmp/ov && mkdir /tmp/ov && tar --exclude=./.whl --exclude=./.whl-extra --exclude=./.git -cf - . | tar -xf - -C /tmp/ov \
    && (cd /tmp/ov && git apply docs/wip/fill-overlap.patch) && at "patched copy made"
  (cd /tmp/ov && timeout $(left 230) python3 -m pytest -q tests/test_gemv_cuda.py tests/test_slot_directory_cuda.py \
    tests/test_decode_segments_cuda.py -k "two_passes or kernels_make or fill_copies or directory" > $R/pytest_ov.log 2>&1
   echo $? > /tmp/ov_rc) &
  (timeout $(left 230) python3 -m pytest -q tests/test_attention_cuda.py > $R/pytest_attn.log 2>&1; echo $? > /tmp/keys_rc) &
  (timeout $(left 230) python3 -m pytest -q tests/test_gemv_cuda.py -k units > $R/pytest_units.log 2>&1
   echo $? > /tmp/units_rc) &
  wait
  at "tests: overlap rc=$(cat /tmp/ov_rc) attention rc=$(cat /tmp/keys_rc) units rc=$(cat /tmp/units_rc)"
  for f in ov attn units; do tail -2 $R/pytest_$f.log; done
fi
wait
timeout $(left 290) python3 -m scripts.bench.bench_attention_cuda --shape seed --decode-only --kv-chunks 32,64,128 \
  --decode-split tiles,keys --repeat 20 --out $R/attn_chunks.json > $R/attn_chunks.log 2>&1
at "attention chunks rc=$?"
arm() {  # NAME LAYOUT WARPS COLUMNS SPLIT: bench_resident_cuda, Q4_K and Q6_K in LAYOUT at WARPS warps of COLUMNS
  # a block, decode attention's split kernel SPLIT
  timeout $(left 520) python3 -c "
import runpy, sys
from gguf.constants import GGMLQuantizationType as QT
import runner.backends.cuda.gemv as g
import runner.backends.cuda.attention as a
g.LAYOUTS[QT.Q4_K] = g.LAYOUTS[QT.Q6_K] = '$2'; g.UNITS_WARPS = $3; g.UNITS_WARP_COLUMNS = $4
a.DECODE_SPLIT = '$5'
sys.argv = ['bench_resident_cuda', '$M', '--out', '$R/resident_$1.$SECONDS.json', '--runs', '3',
            '--decode-contexts', '1024', '--decode-tokens', '32', '--prefill-lengths', '2048']
runpy.run_module('scripts.bench.bench_resident_cuda', run_name='__main__')" >> $R/resident_$1.log 2>&1
  at "resident $1 rc=$?"
}
for round in $(seq ${ROUNDS:-2}); do
  arm main columns 16 2 tiles; arm keys columns 16 2 keys; arm units4 units 4 2 tiles; arm units8 units 8 2 tiles
  arm both units 4 2 keys
done
timeout $(left 570) python3 -m pytest -q tests/test_gemv_multi_cuda.py tests/test_decode_segments_cuda.py > $R/pytest_main.log 2>&1
at "pytest main rc=$?"; tail -3 $R/pytest_main.log
timeout $(left 585) python3 -m scripts.bench.gemv_latency_cuda --out $R/gemv_latency.json > $R/gemv_latency.log 2>&1
at "gemv latency rc=$?"
python3 - $R <<'PY'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("resident_*.json")):
    o = json.loads(f.read_text())["decode_overhead"]
    print(f.name, o["graph_nodes_per_token"], round(o["graph_gpu_ms_per_token"]["median"], 3))
PY
python3 - $R <<'PY'
import json, sys, pathlib
f = pathlib.Path(sys.argv[1]) / "attn_chunks.json"
for row in json.loads(f.read_text())["decode"] if f.exists() else []:
    if row["T"] in (1, 8) and row["kv_dtype"] == "float16" and row["n_kv"] in (1024, 8192, 32768):
        print(row["split"], row["kv_chunk"], row["T"], row["n_kv"], row["cache_rows"], row["l2_flushed"]["ms"]["median"])
PY
cut -c1-150 $R/gemv_latency.log
cd $OUT && tar czf r.tgz r && rm -rf r
