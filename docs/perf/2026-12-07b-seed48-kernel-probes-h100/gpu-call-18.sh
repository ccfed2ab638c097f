#!/usr/bin/env bash
# linears.patch (attention's q, k and v in one gemv_multi launch), gate-up-pair.patch (an expert's gate and up
# tiles in one pass), residual.patch (combine adds the MoE layer's residual) and attn-residual.patch (the output
# projection's GEMV adds the attention's residual; made on top of linears and residual) to land (issue 20 item 3),
# in one call:
# - while seed48 synthesizes: main's updated segments suite (the fold's table width, not yet run on a GPU); in a
#   copy with the four patches, applied in that order (/tmp/both): gemv_multi bit for bit against gemv, the GEMV suite (expert_gate_up bit
#   for bit against swiglu of two gemv launches, every type), the whole forward against numpy, the decode graphs;
# - bench_gemv_cuda --seed-shapes in main and in the copy: gate+up before and after, gemv_multi against three
#   launches (rows 1, 4, 8);
# - seed48 decode at context 1k, 128 tokens: main (directory graphs and the fold, the default now) against the
#   copy (h2h_llama --ours-runner), and llama.cpp's tg; 3 rounds of 2 runs (the profile's decode GPU and host
#   split comes with each of our runs now);
# - bench_directory_cuda: what a layer's directory and miss fills cost, the fill's GB/s against the link's.
# Land a patch if its suites pass, its kernel is faster in the bench, and decode is not slower. gate-up-pair
# raises expert_gate_up's registers (Q4_K 64 -> 99: one CTA an SM instead of two), so the bench decides it.
#   run: PHASE=tests bash docs/wip/gpu-call-18.sh, then at once PHASE=decode (carry [".whl", ".llcuda"]; about
#   5 and 10 minutes: the decode head-to-head needs a whole call for 3 rounds of two seed48 arms)
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
PHASE=${PHASE:-tests}
if [ ! -d /tmp/both ] || [ $PHASE = tests ]; then
rm -rf /tmp/both && mkdir /tmp/both && tar --exclude=./.whl --exclude=./.llcuda --exclude=./.git -cf - . \
  | tar -xf - -C /tmp/both && (cd /tmp/both && git apply docs/wip/linears.patch && git apply docs/wip/gate-up-pair.patch \
  && git apply docs/wip/residual.patch && git apply docs/wip/attn-residual.patch) \
  && at "patched copy made"
fi
if [ $PHASE = tests ]; then
timeout $(left 120) python3 -m pytest -q tests/test_decode_segments_cuda.py > $R/pytest_main.log 2>&1
at "pytest main rc=$?"; tail -2 $R/pytest_main.log
(cd /tmp/both && timeout $(left 300) python3 -m pytest -q tests/test_gemv_multi_cuda.py tests/test_gemv_cuda.py \
  tests/test_fold_shared_cuda.py \
  tests/test_ops_cuda.py tests/test_decode_segments_cuda.py tests/test_slot_directory_cuda.py \
  tests/test_engine_cuda.py > $R/pytest_both.log 2>&1)
at "pytest both rc=$?"; tail -2 $R/pytest_both.log
timeout $(left 330) python3 -m scripts.bench.bench_gemv_cuda --seed-shapes --quick --repeat 30 \
  --out $R/gemv_seed_main.json > $R/gemv_seed_main.log 2>&1; at "gemv seed main rc=$?"
(cd /tmp/both && timeout $(left 360) python3 -m scripts.bench.bench_gemv_cuda --seed-shapes --quick --repeat 30 \
  --out $R/gemv_seed_both.json > $R/gemv_seed_both.log 2>&1); at "gemv seed both rc=$?"
# one layer's device directory: the directory kernel, the fill kernel at 0..10 misses, fill GB/s against memcpy
timeout $(left 380) python3 -m scripts.bench.bench_directory_cuda --out $R/directory.json > $R/directory.log 2>&1
at "directory rc=$?"; tail -3 $R/directory.log
grep gate_up $R/gemv_seed_main.log $R/gemv_seed_both.log | grep '"pairs": 10'; grep -A1 gemv_multi $R/gemv_seed_both.log | head -4
wait
fi
if [ $PHASE = resident ]; then  # the kernels alone: resident seed48, main and the copy alternated, then main's ops
wait
for arm in main both main both; do
  (cd $([ $arm = main ] && pwd || echo /tmp/both) && timeout $(left 560) python3 -m scripts.bench.bench_resident_cuda $M \
    --out $R/resident_$arm.$SECONDS.json --runs 3 --decode-contexts 1024 --decode-tokens 32 --prefill-lengths 2048 \
    >> $R/resident_$arm.log 2>&1); at "resident $arm rc=$?"
done
python3 - $R <<'PY'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("resident_*.json")):
    o = json.loads(f.read_text())["overhead"]
    print(f.name, o["graph_nodes_per_token"], round(o["graph_gpu_ms_per_token"]["median"], 3))
PY
timeout $(left 590) python3 -m scripts.bench.decode_ops $M --slots resident --context 1024 --tokens 16 --runs 1 \
  --queue-ahead-us 300 --out $R/decode_ops_resident.json > $R/decode_ops_resident.log 2>&1; at "decode_ops rc=$?"
fi
if [ $PHASE = decode ]; then
wait
S="--profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none --warm-fill staging"
BOTH="bash -c 'cd /tmp/both && exec python3 -m runner.cli \"\$@\"' runner"
timeout $(left 585) python3 -m scripts.bench.h2h_llama $M --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 \
  --llama-extra "-fa 1 -lm none -t 16" --styles ot-exps-cpu --prompt-file README.md --rounds 3 --repeats 2 \
  --prompt-tokens 1024 --gen 128 --ours "main=$S" --ours "both=$S" --ours-runner "both=$BOTH" \
  --budget-s $(left 575) --keep-reports $R/reports_decode1k --out $R/h2h_decode1k.json > $R/h2h_decode1k.log 2>&1
at "h2h decode1k rc=$?"; tail -6 $R/h2h_decode1k.log
fi
cd $OUT && tar czf r.tgz r && rm -rf r
