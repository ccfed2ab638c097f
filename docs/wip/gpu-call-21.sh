#!/usr/bin/env bash
# fill-overlap.patch (issue 20, the offloaded token's misses): directory graphs fill the misses on a branch of the
# graph while the held pairs' gate-up and down run, then the filled pairs after the join (OVERLAP_FILLS). The
# offloaded seed48 token is the resident one plus about 2.4 ms of fills at the link's rate (2026-12-07b); the
# held pairs' expert work (about 35 us a layer) can hide under them.
# - in a patched copy (/tmp/ov): its GPU tests (the pass filter's bits, directory_serve's fresh flags against the
#   twin, the overlap's logits against fills in order, the decode graph suites);
# - seed48 decode at context 1k, 150 slots: main against the copy (h2h --ours-runner), llama.cpp's tg beside, 3
#   rounds of 2 runs. Land it if the tests pass and decode is faster.
#   run: bash docs/wip/gpu-call-21.sh    carry: [".whl", ".llcuda"]    (about 9 minutes)
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
rm -rf /tmp/ov && mkdir /tmp/ov && tar --exclude=./.whl --exclude=./.llcuda --exclude=./.git -cf - . | tar -xf - -C /tmp/ov \
  && (cd /tmp/ov && git apply docs/wip/fill-overlap.patch) && at "patched copy made"
(cd /tmp/ov && timeout $(left 170) python3 -m pytest -q tests/test_gemv_cuda.py tests/test_slot_directory_cuda.py \
  tests/test_decode_segments_cuda.py -k "two_passes or kernels_make or fill_copies or directory" > $R/pytest_ov.log 2>&1)
at "pytest overlap rc=$?"; tail -3 $R/pytest_ov.log
wait
OV="bash -c 'cd /tmp/ov && exec python3 -m runner.cli \"\$@\"' runner"
h2h_decode1k --ours "main=$DECODE" --ours "overlap=$DECODE" --ours-runner "overlap=$OV"
cd $OUT && tar czf r.tgz r && rm -rf r
