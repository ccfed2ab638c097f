#!/usr/bin/env bash
# gpu-call-14 and gpu-call-7 PHASE=decode in one call (2026-12-06e: starts were scarce, so one box does all of
# seed48's work): the GPU tests of the wait spans and the grouped slot cache run while seed48 synthesizes (the
# tests are not timed); then issue 19's kernel seconds (timing.compute_busy_s) at 2k, 8k and 32k in 3 processes;
# then issue 20's seed48 decode at 1k: segments against directory graphs against llama.cpp's tg, 3 rounds; then
# decode_ops --queue-ahead-us: each op's kernel time alone.
#   run: bash docs/wip/gpu-call-15.sh    carry: [".whl", ".llcuda"]
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
timeout $(left 300) python3 -m pytest -q tests/test_timeline_cuda.py tests/test_offload_cuda.py \
  tests/test_graph_survival_cuda.py tests/test_decode_segments_cuda.py tests/test_slot_directory_cuda.py \
  tests/test_warm_fill.py > $R/pytest.log 2>&1
at "pytest rc=$?"; tail -3 $R/pytest.log
# docs/wip/fold-shared.patch's GPU tests, applied and reverted here while seed48 may still be synthesizing.
if [ $(left 300) -gt 60 ] && git apply docs/wip/fold-shared.patch; then
  timeout $(left 330) python3 -m pytest -q tests/test_fold_shared_cuda.py tests/test_route_cuda.py \
    tests/test_decode_segments_cuda.py tests/test_slot_directory_cuda.py tests/test_graph_survival_cuda.py \
    tests/test_nextn_graph_cuda.py > $R/pytest_fold.log 2>&1
  at "pytest fold rc=$?"; tail -3 $R/pytest_fold.log
  git apply -R docs/wip/fold-shared.patch || { echo "fold patch did not revert"; cd $OUT && tar czf r.tgz r; exit 1; }
fi
wait
for i in 1 2 3; do
  [ $(left 330) -lt 40 ] && break
  timeout $(left 380) python3 -m runner.cli profile $M --prompt-file README.md --prompt-tokens 2048 \
    --prompt-tokens 8192 --prompt-tokens 32768 --gen 16 --warmup 1 --repeat 2 --profile none --offload \
    --cache-slots 150 -ub 512 --vram-budget 24 --draft none --warm-fill staging --prefill-order layer_major \
    --prefill-ubatch 2048 --json $R/busy$i.json > $R/busy$i.log 2>&1
  at "profile $i rc=$?"
  python3 -c "import json; [print(r['prompt_tokens'], round(r['ttft_s'], 3), 'copy', round(r['copy_s'], 3), 'compute',
    round(r['compute_s'], 3), 'wait', round(r['upload_wait_s'], 3), 'busy', round(r['compute_busy_s'], 3))
    for r in json.load(open('$R/busy$i.json'))['runs']]"
done
S="--profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none --warm-fill staging"
timeout $(left 585) python3 -m scripts.bench.h2h_llama $M --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 \
  --llama-extra "-fa 1 -lm none -t 16" --styles ot-exps-cpu --prompt-file README.md --rounds 3 --repeats 2 \
  --prompt-tokens 1024 --gen 128 --ours "segments=$S" --ours "directory=$S --decode-graph directory" \
  --budget-s $(left 580) --keep-reports $R/reports_decode1k --out $R/h2h_decode1k.json > $R/h2h_decode1k.log 2>&1
at "h2h decode1k rc=$?"; tail -6 $R/h2h_decode1k.log
# Each decode op's kernel time alone (a 300 us spin before it while the host launches it), 150 slots, eager.
[ $(left 560) -gt 30 ] && { timeout $(left 590) python3 -m scripts.bench.decode_ops $M --context 1024 --tokens 32 \
  --slots 150 --runs 1 --queue-ahead-us 300 --out $R/decode_ops_qa.json > $R/decode_ops_qa.log 2>&1
  at "decode_ops queue-ahead rc=$?"; tail -2 $R/decode_ops_qa.log; }
cd $OUT && tar czf r.tgz r && rm -rf r
