#!/usr/bin/env bash
# One call from a cold box, tree at main (fill-kernel, grouped attention, directory graphs, rope-store and
# the chunked DeltaNet landed on 2026-12-05), in order of what the open issues need most:
# 1. decode against llama.cpp on seed8 (prompt 1k, 128 tokens, 3 rounds): segments, directory graphs, and
#    directory graphs under the calibrated locality routing (labelled synthetic);
# 2. the chunked DeltaNet against the scan (35B shape);
# 3. A/B by reverting one landed commit (.ab/*.patch, `git show` of it): grouped attention at 32k prompts,
#    rope-store on decode (segments); 2 or 3 processes an arm;
# 4. kernels per decode token under nsys, segments and directory;
# 5. the same head-to-head at an 8k prompt (segments, directory) if time is left.
# Two calls: PHASE=ab (2, 3, 4 and the MTP sweep on the demo model; carry [".whl", ".ab"]) and PHASE=h2h
# (1, 5 and prefill_ops with grouped attention on and off; carry [".whl", ".llcuda", ".ab"]).
source docs/wip/device-env.sh
setup_box
S="--profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none --warm-fill staging"
if [ "${PHASE:-ab}" = h2h ]; then
[ -f .llcuda/llama-cuda-sm90.tar.xz ] && llama_cuda; wait
h2h() {  # $1 prompt tokens, $2 label, then --ours arms
  local n=$1 label=$2; shift 2
  timeout $(left ${LIM:-480}) python3 -m scripts.bench.h2h_llama /root/m/seed8.gguf --llama-bench /tmp/lc/pkg/bin/llama-bench \
    --ubatch 2048 --llama-extra "-fa 1 -lm none -t 16" --rounds 3 --repeats 2 --prompt-tokens $n --gen 128 --styles ot-exps-cpu \
    --prompt-file README.md "$@" --keep-reports $R/reports_$label --out $R/h2h_$label.json > $R/h2h_$label.log 2>&1
  at "h2h $label rc=$?"; tail -14 $R/h2h_$label.log
}
[ -z "${SKIP_OPS:-}" ] && for arm in on off; do  # grouped attention slower at 32k in the ab phase (kernels 0.49 against 0.47 s): which op
  [ $arm = off ] && git apply -R .ab/grouped.patch
  timeout $(left ${LIM:-480}) python3 -m scripts.bench.prefill_ops /root/m/seed8.gguf --tokens 32768 --warm-fill staging \
    --out $R/prefill_ops_grouped_$arm.json > $R/prefill_ops_grouped_$arm.log 2>&1
  at "prefill_ops grouped $arm rc=$?"; [ $arm = off ] && git apply .ab/grouped.patch
done
python3 - $R <<'PY'
import json, sys
for arm in ("on", "off"):
    try:
        r = json.load(open(f"{sys.argv[1]}/prefill_ops_grouped_{arm}.json"))["runs"][-1]
    except (OSError, KeyError, ValueError) as e:
        print(arm, "none:", e); continue
    print(arm, round(r["ops_gpu_s"], 4), {k: (v["calls"], round(v["gpu_s"], 4)) for k, v in r["ops"].items()})
PY
if [ -f .llcuda/llama-cuda-sm90.tar.xz ]; then
  h2h 1024 decode1k --ours "segments=$S" --ours "directory=$S --decode-graph directory" \
    --ours "directory-locality=$S --decode-graph directory --routing locality-qwen3-30b-a3b"
else  # no llama.cpp build carried: our arms alone, alternated, 3 processes each
  for round in 1 2 3; do
    for arm in segments directory; do
      timeout $(left ${LIM:-480}) python3 -m runner.cli profile /root/m/seed8.gguf --prompt-file README.md --prompt-tokens 1024 \
        --gen 128 --warmup 1 $S --decode-graph $arm --json $R/decode1k_${arm}_r$round.json > $R/decode1k_${arm}_r$round.log 2>&1
      at "decode1k $arm $round rc=$?"; grep "^decode " $R/decode1k_${arm}_r$round.log
    done
  done
fi
[ -f .llcuda/llama-cuda-sm90.tar.xz ] && [ $(left 330) -gt 0 ] && h2h 8192 decode8k --ours "segments=$S" --ours "directory=$S --decode-graph directory"
else
timeout 60 python3 -m scripts.bench.bench_delta_net_cuda --shape 35b --out $R/delta_net_35b.json > $R/delta_net_35b.log 2>&1
at "bench_delta_net rc=$?"; grep '"T": 2048' $R/delta_net_35b.log | cut -c1-400
wait
profile() {  # $1 output label, then runner profile arguments
  local label=$1; shift
  [ $(left 560) -lt 30 ] && return
  timeout $(left 560) python3 -m runner.cli profile /root/m/seed8.gguf --prompt-file README.md "$@" \
    --json $R/ab_$label.json > $R/ab_$label.log 2>&1
  at "profile $label rc=$?"
}
for round in 1 2; do  # grouped attention at 32k: landed vs reverted
  profile grouped_on_32k_r$round --prompt-tokens 32768 --gen 4 --warmup 1 --repeat 2 $S
  git apply -R .ab/grouped.patch && profile grouped_off_32k_r$round --prompt-tokens 32768 --gen 4 --warmup 1 --repeat 2 $S
  git apply .ab/grouped.patch
done
for round in 1 2 3; do  # rope-store on decode: landed vs reverted (segments, prompt 1k, 128 tokens)
  profile rope_on_r$round --prompt-tokens 1024 --gen 128 --warmup 1 $S
  git apply -R .ab/rope-store.patch && profile rope_off_r$round --prompt-tokens 1024 --gen 128 --warmup 1 $S
  git apply .ab/rope-store.patch
done
git status --short | head -5
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys 2>/dev/null | head -1)
for kind in segments directory; do  # launches per decode token: (kernels at 96 tokens - at 32) / 64
  for gen in 32 96; do
    { [ $(left 500) -lt 30 ] || [ -z "$NSYS" ]; } && break 2
    timeout $(left 560) $NSYS profile -o /tmp/nsys_${kind}_$gen --cuda-graph-trace=node --force-overwrite true \
      python3 -m runner.cli profile /root/m/seed8.gguf --prompt-file README.md --prompt-tokens 256 --gen $gen $S \
      --decode-graph $kind > $R/nsys_${kind}_$gen.log 2>&1
    $NSYS stats -q --report cuda_gpu_kern_sum --format csv /tmp/nsys_${kind}_$gen.nsys-rep > $R/kern_${kind}_$gen.csv 2>&1
    at "nsys $kind gen $gen rc=$?"
  done
done
python3 - $R <<'PY'
import csv, glob, json, statistics, sys
R = sys.argv[1]
def launches(path):
    rows = [r for r in csv.DictReader(l for l in open(path) if "," in l)]
    return sum(int(r.get("Instances", r.get("Count", 0)) or 0) for r in rows)
for kind in ("segments", "directory"):
    try:
        a, b = (launches(f"{R}/kern_{kind}_{g}.csv") for g in (32, 96))
        print(kind, "kernels per decode token", (b - a) / 64)
    except (OSError, ValueError) as e:
        print(kind, "no count:", e)
for label in ("grouped_on_32k", "grouped_off_32k", "rope_on", "rope_off"):
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{R}/ab_{label}_r*.json"))]
    print(label, "ttft", [round(r["ttft_s"], 4) for r in runs],
          "decode tok/s", [round(r["decode"].get("decode_tok_s") or 0, 1) for r in runs])
PY
[ $(left 440) -gt 0 ] && { timeout $(left 580) python3 -m scripts.bench.bench_mtp runner/data/demo.gguf --slots resident \
  --context 768 --tokens 128 --runs 5 --accept 0.5,0.7,0.9 --out $R/mtp_demo_resident.json > $R/mtp_demo_resident.log 2>&1
  at "mtp demo resident rc=$?"; tail -1 $R/mtp_demo_resident.log | cut -c1-600; }
fi
cd $OUT && tar czf r.tgz r && rm -rf r
