#!/usr/bin/env bash
# keep-slots.patch (docs/wip/README.md): the GPU tests with it applied, then prompts on seed8 against main,
# 3 rounds alternated, at 1k, 2k and 8k (`runner profile --warmup 1 --repeat 2`: the warm-up leaves the slots
# full, so each measured prompt keeps 150 experts a layer), and the 1k head-to-head with llama.cpp that
# main lost (0.81x). Cold box, tree at main.
#   run: bash docs/wip/gpu-call-8.sh        carry: [".whl", ".llcuda"]
source docs/wip/device-env.sh
setup_box; llama_cuda; wait
git apply docs/wip/keep-slots.patch || { echo "cannot apply keep-slots"; exit 1; }
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf tests/test_offload_cuda.py tests/test_warm_fill.py \
  tests/test_prefill_stream.py > $R/gpu_tests.log 2>&1
RC=$?; at "GPU tests rc=$RC"; tail -5 $R/gpu_tests.log
git apply -R docs/wip/keep-slots.patch
[ $RC -eq 0 ] || { cd $OUT && tar czf r.tgz r && rm -rf r; exit 1; }
S="--profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none --warm-fill staging"
for round in 1 2 3; do
  for arm in main keep; do
    [ $arm = keep ] && git apply docs/wip/keep-slots.patch
    for n in 1024 2048 8192; do
      [ $(left 420) -lt 20 ] && break
      timeout $(left 420) python3 -m runner.cli profile /root/m/seed8.gguf --prompt-file README.md --prompt-tokens $n \
        --gen 8 --warmup 1 --repeat 2 $S --json $R/ks_${arm}_${n}_r$round.json > $R/ks_${arm}_${n}_r$round.log 2>&1
      at "round $round $arm $n rc=$?"
    done
    [ $arm = keep ] && git apply -R docs/wip/keep-slots.patch
  done
done
python3 - $R <<'PY'
import glob, json, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/ks_*.json")):
    r = json.load(open(f)); p = r["prefill"]
    print(f.split("/")[-1], [round(x["ttft_s"], 4) for x in r["runs"]], "stream", p["stream_bytes"], "skipped experts",
          sum(x.get("skipped_experts", 0) for x in p["per_layer"]))
PY
git apply docs/wip/keep-slots.patch
timeout $(left 585) python3 -m scripts.bench.h2h_llama /root/m/seed8.gguf --llama-bench /tmp/lc/pkg/bin/llama-bench \
  --ubatch 2048 --llama-extra "-fa 1 -lm none -t 16" --rounds 3 --repeats 2 --prompt-tokens 1024 --gen 16 --pp-only \
  --styles ot-exps-cpu --prompt-file README.md --ours "keep=$S" --out $R/h2h_keep_1k.json > $R/h2h_keep_1k.log 2>&1
at "h2h keep 1k rc=$?"; tail -4 $R/h2h_keep_1k.log
git apply -R docs/wip/keep-slots.patch
cd $OUT && tar czf r.tgz r && rm -rf r
