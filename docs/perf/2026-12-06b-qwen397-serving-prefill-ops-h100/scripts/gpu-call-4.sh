#!/usr/bin/env bash
# Issue 24 item 6: the agent-trace serving benchmark (scripts/bench/bench_agent_trace.py) against llama-server
# on the same file and trace, from a cold or warm box (setup_box in device-env.sh),
# from a working tree at main. Three arms, each a fresh server per round, 3 rounds
# interleaved: ours (`runner serve`, 150 slots, 24 GiB, --cache-ram 16), llama-server as it ships (-np auto:
# 4 slots sharing a unified 32k K/V, so it can keep every conversation live) and llama-server -np 1 (one
# live conversation plus --cache-ram, as ours). Trace: 3 conversations of 8 turns, ~95% of each prompt
# reused from its conversation's previous one, interleaved A B C A B C; 32 generated tokens a request.
#   run: bash docs/wip/gpu-call-4.sh        carry: [".whl", ".llcuda"]  (its tarball holds llama-server)
# On a CPU machine (a dry run of the script itself): OUT=/tmp/o MODEL=tiny.gguf LLBIN=<pkg/bin> ROUNDS=1
#   TRACE="--conversations 2 --turns 3 --system-words 100 --gen 8" OURS_FLAGS="--offload --cache-slots 4"
source docs/wip/device-env.sh
M=${MODEL:-/root/m/seed8.gguf}
if [ -z "${LLBIN:-}" ]; then setup_box; llama_cuda; LLBIN=/tmp/lc/pkg/bin; wait; fi
TRACE=${TRACE:-"--conversations 3 --turns 8 --system-words 1500 --gen 32"}
TRACE="$TRACE --seed 1 --warmup 1"
OURS_FLAGS=${OURS_FLAGS:-"--offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --warm-fill staging"}
OURS="$M --profile none $OURS_FLAGS --draft none -c 32768 --cache-ram 16"
LL="-m $M -ngl 99 -ot exps=CPU -fa on -t 16 -c 32768 -ub 2048 -b 2048 --cache-ram 16384 --jinja --port 8081"
left() { echo $(( ${BUDGET:-585} - ($(date +%s) - T0) )); }
serves() {  # wait until llama-server answers /health (it loads the model first)
  python3 - <<'PY'
import time, urllib.request
for _ in range(240):
    try:
        urllib.request.urlopen("http://127.0.0.1:8081/health", timeout=2).read(); raise SystemExit(0)
    except OSError:
        time.sleep(0.5)
raise SystemExit(1)
PY
}
llama_arm() {  # NAME ROUND EXTRA-FLAGS
  $LLBIN/llama-server $LL $3 > $R/$1_$2.server.log 2>&1 & local pid=$!
  if serves; then
    timeout $(left) python3 -m scripts.bench.bench_agent_trace --url http://127.0.0.1:8081 $TRACE --out $R/$1_$2.json \
      > $R/$1_$2.log 2>&1
    at "$1 round $2 rc=$?"
  else
    at "$1 round $2: llama-server did not serve"; tail -3 $R/$1_$2.server.log
  fi
  kill $pid; wait $pid 2>/dev/null
}
for r in $(seq ${ROUNDS:-3}); do
  [ $(left) -lt 60 ] && break
  timeout $(left) python3 -m scripts.bench.bench_agent_trace --serve "$OURS" $TRACE --out $R/ours_$r.json > $R/ours_$r.log 2>&1
  at "ours round $r rc=$?"
  [ $(left) -lt 60 ] && break
  llama_arm llama-np-auto $r ""
  [ $(left) -lt 60 ] && break
  llama_arm llama-np1 $r "-np 1"
done
python3 - $R <<'PY'
import glob, json, statistics, sys
def med(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f}, n={len(xs)})" if xs else "-"
for arm in ("ours", "llama-np-auto", "llama-np1"):
    runs = [r for f in sorted(glob.glob(f"{sys.argv[1]}/{arm}_*.json")) for r in json.load(open(f))["runs"]]
    if not runs:
        print(arm, "no runs"); continue
    cold = [r for r in runs if r["turn"] == 0]; warm = [r for r in runs if r["turn"] > 0]
    share = [r["cached_tokens"] / r["prompt_tokens"] for r in warm if r["cached_tokens"] is not None]
    print(f"{arm}: TTFT cold {med([r['client']['ttft_s'] for r in cold])} s, later turns "
          f"{med([r['client']['ttft_s'] for r in warm])} s, reused share {med(share)}, "
          f"decode {med([r['client']['decode_tok_s'] for r in runs])} tok/s")
PY
cd $OUT && tar czf r.tgz r && rm -rf r
