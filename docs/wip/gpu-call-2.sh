#!/usr/bin/env bash
# The A/B of the copy-engine reading (docs/wip/README.md, pinned-ids) on seed8 at 2k and 8k: main, pinned
# ids, and pinned ids with the fill kernel, one process each per round, 3 rounds, alternated; both warm
# fills. Run on a warm box right after gpu-call-1.sh (it reuses /tmp/site, /tmp/llsite, /root/m/seed8.gguf)
# from a working tree at main with none of these two patches applied. Results in $OUT/r.tgz.
#   run: bash docs/wip/gpu-call-2.sh        carry: []
source docs/wip/device-env.sh
arm_patches() {
  case $1 in
    main) ;;
    pinned) echo docs/wip/pinned-ids.patch ;;
    both) echo docs/wip/pinned-ids.patch docs/wip/fill-kernel.patch ;;
  esac
}
S8="--offload --profile none --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none"
for round in 1 2 3; do
  for arm in main pinned both; do
    for fill in staging host; do
      [ "$arm" = both ] && [ "$fill" = host ] && continue  # the fill kernel only changes staging
      LEFT=$(( 585 - ($(date +%s) - T0) )); [ $LEFT -lt 30 ] && break 4
      for p in $(arm_patches $arm); do git apply $p || { echo "cannot apply $p"; exit 1; }; done
      for n in 2048 8192; do
        timeout $LEFT python3 -m runner.cli profile /root/m/seed8.gguf --prompt-file README.md --prompt-tokens $n \
          --gen 8 --warmup 1 --repeat 2 $S8 --warm-fill $fill --json $R/ab_${arm}_${fill}_${n}_r$round.json \
          > $R/ab_${arm}_${fill}_${n}_r$round.log 2>&1
        at "round $round $arm $fill $n rc=$?"
      done
      for p in $(arm_patches $arm | tr ' ' '\n' | tac); do git apply -R $p; done
    done
  done
done
python3 - $R <<'EOF'
import glob, json, statistics, sys
rows = {}
for f in sorted(glob.glob(f"{sys.argv[1]}/ab_*.json")):
    arm = "_".join(f.split("/")[-1].split("_")[1:4])
    r = json.load(open(f))
    t = r["timeline"]
    copies = sorted((s for s in t if s["stream"] == "copy"), key=lambda s: s["start_s"])
    gaps = [b["start_s"] - a["end_s"] for a, b in zip(copies, copies[1:])]
    first = next(s for s in t if s["stream"] == "compute" and s["label"] == "visit 0")
    rows.setdefault(arm, []).append((statistics.median(x["ttft_s"] for x in r["runs"]), sum(gaps),
                                     first["end_s"] - first["start_s"]))
for arm, v in sorted(rows.items()):
    print(arm, "ttft", [round(x[0], 4) for x in v], "gaps_s", [round(x[1], 4) for x in v],
          "layer1_s", [round(x[2], 4) for x in v])
EOF
cd $OUT && tar czf r.tgz r && rm -rf r
