#!/usr/bin/env bash
# Issue 19's last seed48 figure: kernel seconds of a layer-major prompt at 2k, 8k and 32k (target: <= 0.6 s at
# 8k), now that `runner profile` times the compute stream's waits for uploads (timing.compute_busy_s, per run in
# `runs`). Three processes of home-24g's setting, each running the three lengths; then the GPU tests of the wait
# spans and of the grouped slot cache. Run it before gpu-call-13.sh, which deletes seed48 for the glm45-air file.
#   run: bash docs/wip/gpu-call-14.sh    carry: [".whl"]    (about 110 s synthesis + 3 x 30 s)
source docs/wip/device-env.sh
setup_box
M=/root/m/seed48.gguf
[ -s $M ] || { python3 -m runner.cli synth $M --arch glm4moe --preset seed --quant Q4_K_M --jobs 14 \
  > $R/synth48.log 2>&1; at "synth seed48 rc=$?"; }
wait
for i in 1 2 3; do
  [ $(left 540) -lt 60 ] && break
  python3 -m runner.cli profile $M --prompt-file README.md --prompt-tokens 2048 --prompt-tokens 8192 \
    --prompt-tokens 32768 --gen 16 --warmup 1 --repeat 2 --profile none --offload --cache-slots 150 -ub 512 \
    --vram-budget 24 --draft none --warm-fill staging --prefill-order layer_major --prefill-ubatch 2048 \
    --json $R/busy$i.json > $R/busy$i.log 2>&1
  at "profile $i rc=$?"
  python3 -c "import json; [print(r['prompt_tokens'], round(r['ttft_s'], 3), 'copy', round(r['copy_s'], 3), 'compute',
    round(r['compute_s'], 3), 'busy', round(r['compute_busy_s'], 3)) for r in json.load(open('$R/busy$i.json'))['runs']]"
done
# The wait spans on the GPU, and the slot cache in groups of layers (548873a) through the CUDA arena and graphs.
timeout $(left 590) python3 -m pytest -q tests/test_timeline_cuda.py tests/test_offload_cuda.py \
  tests/test_graph_survival_cuda.py tests/test_decode_segments_cuda.py tests/test_slot_directory_cuda.py \
  tests/test_warm_fill.py > $R/pytest.log 2>&1
at "pytest rc=$?"; tail -3 $R/pytest.log
cd $OUT && tar czf r.tgz r && rm -rf r
