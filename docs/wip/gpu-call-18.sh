#!/usr/bin/env bash
# linears.patch (attention's q, k and v in one gemv_multi launch; issue 20 item 3) to land, in one call:
# - while seed48 synthesizes: main's updated segments suite (the fold's table width, not yet run on a GPU) and
#   the patch's GPU suites in a patched copy (/tmp/linears): gemv_multi bit for bit against gemv, the GEMV suite,
#   the whole forward against numpy, the decode graphs;
# - bench_gemv_cuda --seed-shapes in the copy: gemv_multi against the three separate launches (rows 1, 4, 8);
# - seed48 decode at context 1k, 128 tokens: main (directory graphs and the fold, now the default) against the
#   patched copy (h2h_llama --ours-runner), and llama.cpp's tg; 3 rounds of 2 runs.
#   run: bash docs/wip/gpu-call-18.sh    carry: [".whl", ".llcuda"]    (about 8 minutes)
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
rm -rf /tmp/linears && mkdir /tmp/linears && tar --exclude=./.whl --exclude=./.llcuda --exclude=./.git -cf - . \
  | tar -xf - -C /tmp/linears && (cd /tmp/linears && git apply docs/wip/linears.patch) && at "linears copy made"
timeout $(left 120) python3 -m pytest -q tests/test_decode_segments_cuda.py > $R/pytest_main.log 2>&1
at "pytest main rc=$?"; tail -2 $R/pytest_main.log
(cd /tmp/linears && timeout $(left 300) python3 -m pytest -q tests/test_gemv_multi_cuda.py tests/test_gemv_cuda.py \
  tests/test_ops_cuda.py tests/test_decode_segments_cuda.py tests/test_slot_directory_cuda.py \
  tests/test_engine_cuda.py > $R/pytest_linears.log 2>&1)
at "pytest linears rc=$?"; tail -2 $R/pytest_linears.log
(cd /tmp/linears && timeout $(left 340) python3 -m scripts.bench.bench_gemv_cuda --seed-shapes --quick --repeat 30 \
  --out $R/gemv_seed.json > $R/gemv_seed.log 2>&1); at "gemv seed rc=$?"; tail -1 $R/gemv_seed.log
wait
S="--profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none --warm-fill staging"
LINEARS="bash -c 'cd /tmp/linears && exec python3 -m runner.cli \"\$@\"' runner"
timeout $(left 585) python3 -m scripts.bench.h2h_llama $M --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 \
  --llama-extra "-fa 1 -lm none -t 16" --styles ot-exps-cpu --prompt-file README.md --rounds 3 --repeats 2 \
  --prompt-tokens 1024 --gen 128 --ours "main=$S" --ours "linears=$S" --ours-runner "linears=$LINEARS" \
  --budget-s $(left 575) --keep-reports $R/reports_decode1k --out $R/h2h_decode1k.json > $R/h2h_decode1k.log 2>&1
at "h2h decode1k rc=$?"; tail -6 $R/h2h_decode1k.log
cd $OUT && tar czf r.tgz r && rm -rf r
