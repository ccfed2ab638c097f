#!/usr/bin/env bash
# Issue 20, seed48's offloaded decode at 1k against llama.cpp's tg (2026-12-07d), after gpu-call-25 tested and
# timed the kernel candidates resident: our arms main, overlap (fill-overlap.patch on a patched copy, its GPU
# tests first) and, where KERNELS names one, a kernels arm: KERNELS=keys (decode attention's keys split),
# units4 (Q4_K and Q6_K GEMVs in the units layout at 4 warps of 2 columns) or both.
#   run: KERNELS=both bash docs/wip/gpu-call-26.sh    carry: [".whl", ".whl-extra", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
rm -rf /tmp/ov && mkdir /tmp/ov && tar --exclude=./.whl --exclude=./.whl-extra --exclude=./.llcuda --exclude=./.git -cf - . \
  | tar -xf - -C /tmp/ov && (cd /tmp/ov && git apply docs/wip/fill-overlap.patch) && at "patched copy made"
(cd /tmp/ov && timeout $(left 200) python3 -m pytest -q tests/test_gemv_cuda.py tests/test_slot_directory_cuda.py \
  tests/test_decode_segments_cuda.py -k "two_passes or kernels_make or fill_copies or directory" > $R/pytest_ov.log 2>&1)
OV_RC=$?; at "overlap tests rc=$OV_RC"; tail -2 $R/pytest_ov.log
wait
variant() {  # NAME PYTHON: a runner.cli that runs PYTHON first, as that arm's runner
  printf 'import os, runpy, sys\nsys.path.insert(0, os.getcwd())\n%s\nsys.argv[0] = "runner"\nrunpy.run_module("runner.cli", run_name="__main__")\n' \
    "$2" > /tmp/variant_$1.py
  ARMS+=(--ours "$1=$DECODE" --ours-runner "$1=python3 /tmp/variant_$1.py")
}
ARMS=(--ours "main=$DECODE")
[ $OV_RC = 0 ] && ARMS+=(--ours "overlap=$DECODE" --ours-runner "overlap=bash -c 'cd /tmp/ov && exec python3 -m runner.cli \"\$@\"' runner")
KEYS="import runner.backends.cuda.attention as a
a.DECODE_SPLIT = 'keys'"
UNITS4="from gguf.constants import GGMLQuantizationType as QT
import runner.backends.cuda.gemv as g
g.LAYOUTS[QT.Q4_K] = g.LAYOUTS[QT.Q6_K] = 'units'; g.UNITS_WARPS = 4"
case ${KERNELS:-none} in
  keys) variant keys "$KEYS";; units4) variant units4 "$UNITS4";; both) variant both "$KEYS
$UNITS4";;
esac
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
