#!/usr/bin/env bash
# Issue 20, seed48's offloaded decode at 1k against llama.cpp's tg (2026-12-07d): our arms main, overlap
# (fill-overlap.patch on a patched copy, its GPU tests first) and the kernel candidates that KERNELS names,
# space-separated: keys (decode attention's keys split), units4 (Q4_K and Q6_K GEMVs in the units layout at
# 4 warps of 2 columns), both (the two together). TESTS=1 (where gpu-call-25 did not run) runs the attention
# suite and the units bit tests beside the overlap tests and drops the candidates whose tests fail.
#   run: KERNELS="keys units4 both" TESTS=1 bash docs/wip/gpu-call-26.sh
#   carry: [".whl", ".llcuda"] (with .whl-extra the tree passes 64 MiB)    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
rm -rf /tmp/ov && mkdir /tmp/ov && tar --exclude=./.whl --exclude=./.whl-extra --exclude=./.llcuda --exclude=./.git -cf - . \
  | tar -xf - -C /tmp/ov && (cd /tmp/ov && git apply docs/wip/fill-overlap.patch) && at "patched copy made"
echo 0 > /tmp/keys_rc; echo 0 > /tmp/units_rc
(cd /tmp/ov && timeout $(left 170) python3 -m pytest -q tests/test_gemv_cuda.py tests/test_slot_directory_cuda.py \
  tests/test_decode_segments_cuda.py -k "two_passes or kernels_make or fill_copies or directory" > $R/pytest_ov.log 2>&1
 echo $? > /tmp/ov_rc) &
if [ "${TESTS:-0}" = 1 ]; then
  (timeout $(left 170) python3 -m pytest -q tests/test_attention_cuda.py -k keys > $R/pytest_attn.log 2>&1; echo $? > /tmp/keys_rc) &
  (timeout $(left 170) python3 -m pytest -q tests/test_gemv_cuda.py -k units > $R/pytest_units.log 2>&1
   echo $? > /tmp/units_rc) &
fi
wait
OV_RC=$(cat /tmp/ov_rc) KEYS_RC=$(cat /tmp/keys_rc) UNITS_RC=$(cat /tmp/units_rc)
at "tests: overlap rc=$OV_RC attention rc=$KEYS_RC units rc=$UNITS_RC"
for f in $R/pytest_*.log; do echo "$f: $(tail -1 $f)"; done
variant() {  # NAME PYTHON: a runner.cli that runs PYTHON first, as that arm's runner
  printf 'import os, runpy, sys\nsys.path.insert(0, os.getcwd())\n%s\nsys.argv[0] = "runner"\nrunpy.run_module("runner.cli", run_name="__main__")\n' \
    "$2" > /tmp/variant_$1.py
  ARMS+=(--ours "$1=$DECODE" --ours-runner "$1=python3 /tmp/variant_$1.py")
}
ARMS=(--ours "main=$DECODE")
ok $OV_RC && ARMS+=(--ours "overlap=$DECODE" --ours-runner "overlap=bash -c 'cd /tmp/ov && exec python3 -m runner.cli \"\$@\"' runner")
KEYS="import runner.backends.cuda.attention as a
a.DECODE_SPLIT = 'keys'"
UNITS4="from gguf.constants import GGMLQuantizationType as QT
import runner.backends.cuda.gemv as g
g.LAYOUTS[QT.Q4_K] = g.LAYOUTS[QT.Q6_K] = 'units'; g.UNITS_WARPS = 4"
ok() { [ $1 = 0 ] || [ $1 = 124 ]; }  # passed, or ran out of time (then the arm runs, and its tests' log says so)
for k in ${KERNELS:-}; do
  case $k in
    keys) ok $KEYS_RC && variant keys "$KEYS";;
    units4) ok $UNITS_RC && variant units4 "$UNITS4";;
    both) ok $KEYS_RC && ok $UNITS_RC && variant both "$KEYS
$UNITS4";;
  esac
done
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
