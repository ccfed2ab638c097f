# Sourced by the gpu-call-*.sh scripts: unbuffered output, the call's start time, its results folder under
# $OUT (tarred at the end), `at LABEL` to print seconds since start, `left N` for seconds until N, and
# `setup_box` for a cold box (carry .whl): the wheels, the prebuilt llama_cpp, and seed8 synthesized in the
# background (`wait` before using it); skipped where a warm box already has them.
set -u
export PYTHONUNBUFFERED=1
T0=${T0:-$(date +%s)}  # a caller may start the clock earlier (tests before a script)
R=$OUT/r; mkdir -p $R
export PYTHONPATH=/tmp/site:/tmp/llsite
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64
at() { echo "$1 at $(( $(date +%s) - T0 )) s"; }
# Deadlines in the scripts are seconds into a 600 s call; a call given less (run's timeout_s) sets CALL_S to it
# and every deadline moves earlier by the difference, so the script still stops and packs before the kill. Never
# below 1: a deadline already past gives `timeout 1`, not a negative count timeout reads as an option (07i).
CALL_S=${CALL_S:-600}
left() { local s=$(( $1 - (600 - CALL_S) - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }
# Killed anyway (timeout sends TERM): keep what the box's disk holds of the records and pack the results.
trap 'at "stopped by a signal"; [ -d /root/m/records ] && cp -r /root/m/records $R/; cd $OUT && tar czf r.tgz r && rm -rf r; exit 143' TERM
setup_box() {
  [ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/*.whl $(ls .whl-extra/*.whl 2> /dev/null) > $R/pip.log 2>&1
  # llama-cpp-python built for any AVX2 x86 on the CPU machine (docs/wip/README.md); the tests' tokenizer needs it
  [ -d /tmp/llsite/llama_cpp ] || { mkdir -p /tmp/llsite && tar -xJf .whl/llama_cpp-0.3.36-avx2.tar.xz -C /tmp/llsite; }
  python3 -c "import llama_cpp" > $R/llama_import.log 2>&1 || echo "llama_cpp does not import (see llama_import.log)"
  mkdir -p /root/m
  [ -s /root/m/seed8.gguf ] || (python3 -m runner.cli synth /root/m/seed8.gguf --arch glm4moe --preset seed --quant Q4_K_M \
    --layers 8 --jobs 12 > $R/synth8.log 2>&1; at "synth seed8 rc=$?") &
}
ncu_path() {  # Nsight Compute's CLI on the box (not on PATH there), or nothing
  command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1
}
llama_cuda() {  # llama-bench and llama-server built off the box (scripts/bench/llama_cuda/build.sh; carry .llcuda)
  mkdir -p /tmp/lc; [ -x /tmp/lc/pkg/bin/llama-server ] || tar -xJf .llcuda/llama-cuda-sm90.tar.xz -C /tmp/lc
}
seed48() {  # M=the 48-layer seed file, synthesized in the background where missing (`wait` before using it)
  M=/root/m/seed48.gguf
  [ -s $M ] && return
  rm -f /root/m/q397.gguf /root/m/air32.gguf  # the disk holds one big file
  (python3 -m runner.cli synth $M --arch glm4moe --preset seed --quant Q4_K_M --jobs 14 > $R/synth48.log 2>&1
   at "synth seed48 rc=$?") &
}
# seed48's decode at context 1k (150 slots, 24 GiB, 128 tokens) against llama.cpp's tg (no pp arm) on the same file, 3 rounds
# of 2 runs, until 575 s into the call; the arms (--ours LABEL=$DECODE, --ours-runner ...) are the arguments.
DECODE="--profile none --offload --cache-slots 150 --prefill-ubatch 2048 -ub 512 --vram-budget 24 --draft none --warm-fill staging"
h2h_decode1k() {
  timeout $(left 585) python3 -m scripts.bench.h2h_llama $M --llama-bench /tmp/lc/pkg/bin/llama-bench --ubatch 2048 \
    --llama-extra "-fa 1 -lm none -t 16" --styles ot-exps-cpu --tg-only --prompt-file README.md --rounds 3 --repeats 2 \
    --prompt-tokens 1024 --gen 128 "$@" --budget-s $(left 575) --keep-reports $R/reports_decode1k \
    --out $R/h2h_decode1k.json > $R/h2h_decode1k.log 2>&1
  at "h2h decode1k rc=$?"; tail -12 $R/h2h_decode1k.log
}
# An h2h arm whose runner.cli runs PYTHON first (a module constant switched on, say): `variant NAME PYTHON` writes
# /tmp/variant_NAME.py and appends `--ours NAME=$DECODE --ours-runner ...` to the array ARMS.
variant() {
  printf 'import os, runpy, sys\nsys.path.insert(0, os.getcwd())\n%s\nsys.argv[0] = "runner"\nrunpy.run_module("runner.cli", run_name="__main__")\n' \
    "$2" > /tmp/variant_$1.py
  ARMS+=(--ours "$1=$DECODE" --ours-runner "$1=python3 /tmp/variant_$1.py")
}
# `resident NAME PYTHON`: bench_resident_cuda on $M (decode at 1k, 32 tokens, a 2k prompt, 3 runs) after PYTHON (a
# module constant switched on, say), until 585 s into the call; its JSON and log under $R named by NAME.
resident() {
  timeout $(left 585) python3 -c "
import runpy, sys
$2
sys.argv = ['bench_resident_cuda', '$M', '--out', '$R/resident_$1.$SECONDS.json', '--runs', '3',
            '--decode-contexts', '1024', '--decode-tokens', '32', '--prefill-lengths', '2048']
runpy.run_module('scripts.bench.bench_resident_cuda', run_name='__main__')" >> $R/resident_$1.log 2>&1
  at "resident $1 rc=$?"
}
# `decode_path_tests DEADLINE SHAPES`: the GPU tests of the decode path 2026-12-07f/g changed without a GPU run (the
# greedy chain and top_k; the graph suites with SPLIT_FILLS; test_gemv_cuda -k SHAPES), in parallel, until DEADLINE;
# each suite's return code lands in $R/rcs ("chain rc=0", ...).
decode_path_tests() {
  (timeout $(left $1) python3 -m pytest -q tests/test_greedy_chain_cuda.py tests/test_top_k_cuda.py \
    > $R/pytest_chain.log 2>&1; echo "chain rc=$?" >> $R/rcs) &
  (timeout $(left $1) python3 -m pytest -q tests/test_graph_survival_cuda.py tests/test_nextn_graph_cuda.py \
    tests/test_decode_segments_cuda.py tests/test_prefetch_cuda.py > $R/pytest_graphs.log 2>&1
   echo "graphs rc=$?" >> $R/rcs) &
  (timeout $(left $1) python3 -m pytest -q tests/test_gemv_cuda.py -k "$2" > $R/pytest_shapes.log 2>&1
   echo "shapes rc=$?" >> $R/rcs) &
  (timeout $(left $1) python3 -m pytest -q tests/test_pdl_cuda.py > $R/pytest_pdl.log 2>&1
   echo "pdl rc=$?" >> $R/rcs) &
  wait
  at "tests"; cat $R/rcs; for f in chain graphs shapes pdl; do tail -n 2 $R/pytest_$f.log; done
  mkdir -p /root/m && cp $R/rcs /root/m/rcs  # a warm box's next call (gpu-call-44) gates its arms on these
}
# `fill_bench DEADLINE REPEAT TAG...`: the fill kernel alone (bench_directory_cuda: serve + fill at 0 to 10 misses,
# seed48's layer) at slot_directory.py's FILL_UNROLL 1 and 4, alternated, once per TAG; about 10 s a run.
fill_bench() {
  local deadline=$1 repeat=$2 i u; shift 2
  for i in "$@"; do for u in 1 4; do
    timeout $(left $deadline) python3 -c "
import runpy, sys
import runner.backends.cuda.slot_directory as sd
sd.FILL_UNROLL = $u
sys.argv = ['bench_directory_cuda', '--repeat', '$repeat', '--out', '$R/directory_unroll${u}_$i.json']
runpy.run_module('scripts.bench.bench_directory_cuda', run_name='__main__')" > $R/directory_unroll${u}_$i.log 2>&1
    at "directory unroll $u rc=$?"; grep -E '"misses": (1|10),' $R/directory_unroll${u}_$i.log | cut -c1-200
  done; done
}
# `screened_stack`: python lines that switch on each knob family's fastest arm of gpu-call-46's resident screen
# (/root/m/decode_arms46.json on a warm box) that kept main's tokens and beat main by 1% or more; nothing without it.
screened_stack() {
  python3 - << 'PY'
import json, pathlib
p = pathlib.Path("/root/m/decode_arms46.json")
arms = json.loads(p.read_text())["arms"] if p.exists() else {}
main = arms.get("main", {}).get("ms_per_token", {}).get("median")
lines = []
for family in (("route18", "route14", "route4w"), ("gateup6", "gateup7"), ("half",), ("ahead", "ahead4")):
    got = [(arms[a]["ms_per_token"]["median"], a) for a in family
           if a in arms and arms[a]["same_tokens_as_main"] and main and arms[a]["ms_per_token"]["median"] < 0.99 * main]
    if got:
        name = min(got)[1]
        lines.append(f"# {name}")
        for path, value in arms[name]["settings"].items():
            module, attr = path.rsplit(".", 1)
            lines.append(f"import {module}; setattr({module}, {attr!r}, {value!r})")
print("\n".join(lines))
PY
}
