#!/usr/bin/env bash
# The fold (docs/wip/fold-shared.patch) to land, and issue 20's seed48 decode decision, in one call:
# - while seed48 synthesizes: main's rewritten partial-warm-fill CUDA test (failed on 2026-12-06e in its budget
#   form) and the fold's GPU suites in a patched copy of the tree (/tmp/fold);
# - then decode at context 1k, 128 tokens: segments and directory graphs, each with and without the fold (the
#   fold's arms start from /tmp/fold through h2h_llama --ours-runner, alternated with main's in the same
#   rounds), and segments without the slot cache's groups of layers (docs/wip/groups.patch reverted: 548873a to
#   2a1cbb7, the one decode-path change between 2026-12-06d's 84 tok/s and 2026-12-06e's 76 on another box),
#   against llama.cpp's tg at depth 1k; 3 rounds of 2 runs; each process's load time is in its report.
# - resident seed48 (bench_resident_cuda: the whole file on the card, one DecodeGraph a token, its GPU ms and
#   nodes): what the kernels alone cost a token (issue 20's resident target, 400 tok/s), one process;
# - seed48's decode GEMVs timed alone (bench_gemv_cuda --seed-shapes);
#   run: bash docs/wip/gpu-call-17.sh    carry: [".whl", ".llcuda"]    (about 7 minutes)
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
rm -rf /tmp/fold && mkdir /tmp/fold && tar --exclude=./.whl --exclude=./.llcuda --exclude=./.git -cf - . \
  | tar -xf - -C /tmp/fold && (cd /tmp/fold && git apply docs/wip/fold-shared.patch) && at "fold copy made"
# main without the slot cache's groups of layers (548873a..2a1cbb7 reverted): did they cost decode 10%?
rm -rf /tmp/nogroups && mkdir /tmp/nogroups && tar --exclude=./.whl --exclude=./.llcuda --exclude=./.git -cf - . \
  | tar -xf - -C /tmp/nogroups && (cd /tmp/nogroups && git apply -R docs/wip/groups.patch) && at "nogroups copy made"
timeout $(left 200) python3 -m pytest -q tests/test_offload_cuda.py > $R/pytest_main.log 2>&1
at "pytest main rc=$?"; tail -2 $R/pytest_main.log
(cd /tmp/fold && timeout $(left 300) python3 -m pytest -q tests/test_fold_shared_cuda.py tests/test_route_cuda.py \
  tests/test_decode_segments_cuda.py tests/test_slot_directory_cuda.py tests/test_graph_survival_cuda.py \
  tests/test_nextn_graph_cuda.py tests/test_engine_cuda.py > $R/pytest_fold.log 2>&1)
at "pytest fold rc=$?"; tail -2 $R/pytest_fold.log
# seed48's decode products timed alone (and an empty kernel, the method's floor): the GEMV latency work's baseline
timeout $(left 330) python3 -m scripts.bench.bench_gemv_cuda --seed-shapes --quick --repeat 30 \
  --out $R/gemv_seed.json > $R/gemv_seed.log 2>&1; at "gemv seed rc=$?"; tail -1 $R/gemv_seed.log
wait
S="--profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none --warm-fill staging"
FOLD="bash -c 'cd /tmp/fold && exec python3 -m runner.cli \"\$@\"' runner"
NOGROUPS="bash -c 'cd /tmp/nogroups && exec python3 -m runner.cli \"\$@\"' runner"
timeout $(left 585) python3 -m scripts.bench.h2h_llama $M --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 \
  --llama-extra "-fa 1 -lm none -t 16" --styles ot-exps-cpu --prompt-file README.md --rounds 3 --repeats 2 \
  --prompt-tokens 1024 --gen 128 --ours "segments=$S" --ours "directory=$S --decode-graph directory" \
  --ours "segments_fold=$S" --ours "directory_fold=$S --decode-graph directory" \
  --ours "segments_nogroups=$S" --ours-runner "segments_nogroups=$NOGROUPS" \
  --ours-runner "segments_fold=$FOLD" --ours-runner "directory_fold=$FOLD" \
  --budget-s $(left 470) --keep-reports $R/reports_decode1k --out $R/h2h_decode1k.json > $R/h2h_decode1k.log 2>&1
at "h2h decode1k rc=$?"; tail -8 $R/h2h_decode1k.log
timeout $(left 590) python3 -m scripts.bench.bench_resident_cuda $M --out $R/resident48.json --runs 3 \
  --decode-contexts 1024 --decode-tokens 32 --prefill-lengths 2048 > $R/resident48.log 2>&1
at "resident48 rc=$?"; tail -3 $R/resident48.log
cd $OUT && tar czf r.tgz r && rm -rf r
