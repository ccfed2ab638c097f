#!/usr/bin/env bash
# The home-24g qualification run on the GPU box: the full seed shape (48 layers, 512 experts top-10,
# Q4_K_M, about 52 GB on disk) at a 24 GiB budget; every figure of profiles/home-24g.toml's
# [evidence.measured] lands as JSON in OUT_DIR, for scripts/fill_evidence.py. About 9 minutes on an
# H200 box with 16 cores and a 64 GB disk (synthesis about 200 s; per-micro-batch 2048 at 8k only).
#   bash scripts/qualify_home24g.sh /root/models OUT_DIR COMMIT
set -uo pipefail
M=${1:?model dir}; R=${2:?out dir}; SHA=${3:-unknown}
mkdir -p "$M" "$R"
MODEL=$M/seed48.gguf
[ -f "$MODEL" ] || python3 -m runner.cli synth "$MODEL" --arch glm4moe --preset seed --quant Q4_K_M --jobs "$(nproc)"
B="--commit $SHA --out"
python3 scripts/bench_offload.py bandwidth --gib 2 $B "$R/bandwidth.json" > /dev/null
python3 scripts/bench_offload.py prefill "$MODEL" --slots 150 --order layer_major --ubatch 2048 \
  --lengths 2048,8192,32768 --runs 3 $B "$R/prefill_layer_major_2048.json" > /dev/null
python3 scripts/bench_offload.py prefill "$MODEL" --slots 150 --order per_microbatch --ubatch 2048 \
  --lengths 8192 --runs 3 $B "$R/prefill_per_microbatch_2048.json" > /dev/null
python3 scripts/bench_offload.py decode "$MODEL" --slots 150 --contexts 1024,8192 --tokens 32 --runs 3 \
  $B "$R/decode_150.json" > /dev/null
ls -la "$R"
