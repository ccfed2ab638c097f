#!/usr/bin/env bash
# The home-24g qualification run on the GPU box: the full seed shape (48 layers, 512 experts top-10,
# Q4_K_M, about 52 GB on disk) at a 24 GiB budget. Every figure of profiles/home-24g.toml's
# [evidence.measured] lands as JSON in OUT_DIR (for scripts/bench/fill_evidence.py), and so does the rest of
# issue 4's table: per micro-batch at 512, 2048 and layer-major at 2k/8k/32k, decode at 50, 150 and
# auto slots at context 1k and 8k. The decode arms at 150 and auto slots run in three processes each
# (decode150_p2, ... write decode_150_p2.json, ...): decode speed varies more between processes than
# within one on the GPU box.
#   bash scripts/bench/qualify_home24g.sh MODEL_DIR OUT_DIR COMMIT [STEP...]
# With STEP names, only those run (in the order given); DEADLINE_S (seconds since start) skips a step
# whose timeout would run past it, so a device call's limit splits the run without losing a result.
# AFTER_STEP, if set, is a command run after each step (a device call packs its results there);
# RESUME=1 skips a step whose JSON is already in OUT_DIR (a second call finishing a split run).
set -uo pipefail
M=${1:?model dir}; R=${2:?out dir}; SHA=${3:-unknown}; shift $(( $# < 3 ? $# : 3 ))
mkdir -p "$M" "$R"
MODEL=$M/seed48.gguf
B="--commit $SHA"
GBS=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pinned_gb_s']['median'])" "$R/bandwidth.json" 2>/dev/null)

step() {  # step NAME TIMEOUT_S ARGS...: one bench_offload.py process, its JSON in $R/NAME.json
  local name=$1 to=$2; shift 2
  if [ "${RESUME:-0}" = 1 ] && [ -s "$R/$name.json" ]; then echo "$name: done before"; return; fi
  if [ -n "${DEADLINE_S:-}" ] && [ $((SECONDS + to)) -gt "$DEADLINE_S" ]; then echo "$name: skipped (deadline)"; return; fi
  local pin=""; [ -n "$GBS" ] && [ "$1" = prefill ] && pin="--pinned-gb-s $GBS"
  echo "$name: python3 -m scripts.bench.bench_offload $* $pin $B --out $name.json" >> "$R/commands.txt"
  local t0=$SECONDS
  timeout "$to" python3 -m scripts.bench.bench_offload "$@" $pin $B --out "$R/$name.json" > /dev/null 2> "$R/$name.err"
  echo "$name: rc=$? in $((SECONDS - t0)) s"
  [ -n "$GBS" ] || GBS=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pinned_gb_s']['median'])" "$R/bandwidth.json" 2>/dev/null)
  [ -z "${AFTER_STEP:-}" ] || eval "$AFTER_STEP"
}

run_step() {
  case $1 in
    synth) [ -f "$MODEL" ] || { local t0=$SECONDS
             python3 -m runner.cli synth "$MODEL" --arch glm4moe --preset seed --quant Q4_K_M --jobs "$(nproc)" > "$R/synth.log" 2>&1
             echo "synth: rc=$? in $((SECONDS - t0)) s"; } ;;
    bandwidth) step bandwidth 60 bandwidth --gib 2 ;;
    lm2048) step prefill_layer_major_2048 200 prefill "$MODEL" --slots 150 --order layer_major --ubatch 2048 --lengths 2048,8192,32768 --runs 3 ;;
    pmb2048) step prefill_per_microbatch_2048 120 prefill "$MODEL" --slots 150 --order per_microbatch --ubatch 2048 --lengths 2048,8192 --runs 3 ;;
    decode150) step decode_150 150 decode "$MODEL" --slots 150 --contexts 1024,8192 --tokens 32 --runs 3 ;;
    decode50) step decode_50 150 decode "$MODEL" --slots 50 --contexts 1024,8192 --tokens 32 --runs 3 ;;
    decodeauto) step decode_auto 150 decode "$MODEL" --slots auto --contexts 1024,8192 --tokens 32 --runs 3 ;;
    # more processes of a decode arm (fill_evidence takes the median of their medians and states the range)
    decode150_p[0-9]*) step "decode_150_${1#decode150_}" 150 decode "$MODEL" --slots 150 --contexts 1024,8192 --tokens 32 --runs 3 ;;
    decodeauto_p[0-9]*) step "decode_auto_${1#decodeauto_}" 150 decode "$MODEL" --slots auto --contexts 1024,8192 --tokens 32 --runs 3 ;;
    pmb512) step prefill_per_microbatch_512 150 prefill "$MODEL" --slots 150 --order per_microbatch --ubatch 512 --lengths 2048,8192 --runs 3 ;;
    pmb2048_32k) step prefill_per_microbatch_2048_32k 120 prefill "$MODEL" --slots 150 --order per_microbatch --ubatch 2048 --lengths 32768 --runs 1 ;;
    pmb512_32k) step prefill_per_microbatch_512_32k 200 prefill "$MODEL" --slots 150 --order per_microbatch --ubatch 512 --lengths 32768 --runs 1 ;;
    *) echo "unknown step $1"; return 1 ;;
  esac
}

STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(synth bandwidth lm2048 pmb2048 decode150 decode50 decodeauto pmb512 pmb2048_32k pmb512_32k
                                 decode150_p2 decodeauto_p2 decode150_p3 decodeauto_p3)
for s in "${STEPS[@]}"; do run_step "$s"; done
ls -la "$R"
