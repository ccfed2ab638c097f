#!/usr/bin/env bash
# Issue 20 (2026-12-07i), three changes that keep every bit and choice, timed:
# - route18: the float32 router's launch at ROUTE_WARP_COLUMNS 1, ROUTE_LOAD_AHEAD 8 (32 CTAs instead of 16, a
#   lane's 8 units in flight at once instead of one after another; ncu: 16 us a layer of resident seed48,
#   docs/perf/2026-12-07i-seed48-defaults-locality-mtp-h100.md);
# - early: DirectoryDecodeGraph.EARLY_SERVE, each serve copying its directory in before its PDL wait, under the
#   router (main's serve already loads it all at once after the wait);
# - gateup6: gemv.GATE_UP_MIN_BLOCKS = 6, expert_gate_up capped at 80 registers so 6 CTAs fit an SM: seed48's 704
#   CTAs in one wave instead of 660 and 44 (ncu: 22.7 us a layer, the largest kernel).
# While seed48 synthesizes: the route bits at every shape and the nvcc build test; the directory kernel against its
# twin; the graph suites with EARLY_SERVE on; the capped gate-up's bits. Then resident main, route18 and gateup6
# (2 processes each, alternated), then offloaded at 1k: main, route18, early and gateup6 against llama.cpp's tg.
# Each arm only if its tests passed.
# Deadlines are seconds into a 600 s call (device-env.sh's `left`).
#   run: bash docs/wip/gpu-call-46.sh    carry: [".whl", ".llcuda"]    timeout_s 600
source docs/wip/device-env.sh
setup_box; llama_cuda
seed48
(timeout $(left 220) python3 -m pytest -q tests/test_fused_launches_cuda.py tests/test_gemv_build.py \
  > $R/pytest_route.log 2>&1; echo "route rc=$?" >> $R/rcs
 timeout $(left 220) python3 -m pytest -q tests/test_gemv_cuda.py -k "register_cap or one_pass" \
  > $R/pytest_gateup.log 2>&1; echo "gateup rc=$?" >> $R/rcs) &
(timeout $(left 220) python3 -m pytest -q tests/test_slot_directory_cuda.py > $R/pytest_directory.log 2>&1
 echo "directory rc=$?" >> $R/rcs) &
(timeout $(left 220) python3 -c "
import sys, pytest
from runner.backends.cuda.token_graph import DirectoryDecodeGraph
DirectoryDecodeGraph.EARLY_SERVE = True
sys.exit(pytest.main(['-q', 'tests/test_prefetch_cuda.py', 'tests/test_pdl_cuda.py', 'tests/test_engine_cuda.py',
                      'tests/test_graph_survival_cuda.py']))" > $R/pytest_early.log 2>&1
 echo "early rc=$?" >> $R/rcs) &
wait
at "tests and synth"; cat $R/rcs; tail -n 2 $R/pytest_*.log
ROUTE18="import runner.backends.cuda.gemv as g
g.ROUTE_WARP_COLUMNS = 1
g.ROUTE_LOAD_AHEAD = 8"
EARLY="from runner.backends.cuda.token_graph import DirectoryDecodeGraph
DirectoryDecodeGraph.EARLY_SERVE = True"
GATEUP6="import runner.backends.cuda.gemv as g
g.GATE_UP_MIN_BLOCKS = 6"
route_ok=; grep -q "^route rc=0" $R/rcs && route_ok=1
early_ok=; grep -q "^directory rc=0" $R/rcs && grep -q "^early rc=0" $R/rcs && early_ok=1
gateup_ok=; grep -q "^gateup rc=0" $R/rcs && gateup_ok=1
for i in 1 2; do
  resident main ""
  [ -n "$route_ok" ] && resident route18 "$ROUTE18"
  [ -n "$gateup_ok" ] && resident gateup6 "$GATEUP6"
done
ARMS=(--ours "main=$DECODE")
[ -n "$route_ok" ] && variant route18 "$ROUTE18"
[ -n "$early_ok" ] && variant early "$EARLY"
[ -n "$gateup_ok" ] && variant gateup6 "$GATEUP6"
h2h_decode1k "${ARMS[@]}"
cd $OUT && tar czf r.tgz r && rm -rf r
