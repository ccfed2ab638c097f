#!/usr/bin/env bash
# Issue 20 item 5's seed48 target (MTP >= 1.3x plain decode offloaded under the calibrated routing at 80%
# acceptance), measured as it is stated for the first time, with and without Engine.MTP_GREEDY_ON_DEVICE (each draft
# and verify row's token chosen by the device's argmax: no 600 KB row to the host a draft; 07i's draft step cost
# 1.0 ms, 0.15 of a decode step, for one layer and the LM head). While seed48 synthesizes: greedy_rows against
# numpy, and the MTP GPU suites with the knob on (its arm runs only if they pass). Then bench_mtp on seed48
# offloaded (150 slots, 1k) under `--routing locality-qwen3-30b-a3b` (labelled synthetic in the JSON): oracle arms
# and forced acceptance 0.8 at forced depths 1 and 2, host then device; with time left the demo model resident.
# 07i measured seed48 under the random router only: a 2-row verify cost 1.63 decode steps.
#   run: bash docs/wip/gpu-call-47.sh    carry: [".whl"]    timeout_s 600
source docs/wip/device-env.sh
setup_box
seed48
(timeout $(left 200) python3 -c "
import sys, pytest
from runner.engine.engine import Engine
Engine.MTP_GREEDY_ON_DEVICE = True
sys.exit(pytest.main(['-q', 'tests/test_greedy_cuda.py', 'tests/test_nextn_graph_cuda.py', 'tests/test_engine_cuda.py',
                      '-k', 'greedy or draft or mtp or nextn or verify']))" > $R/pytest_mtp.log 2>&1
 echo "mtp rc=$?" >> $R/rcs) &
wait
at "tests and synth"; cat $R/rcs; tail -n 2 $R/pytest_mtp.log
DEVICE="from runner.engine.engine import Engine
Engine.MTP_GREEDY_ON_DEVICE = True"
mtp() {  # mtp ARM DEPTH DEADLINE PYTHON: bench_mtp on seed48 under the locality routing after PYTHON
  timeout $(left $3) python3 -c "
import runpy, sys
$4
sys.argv = ['bench_mtp', '$M', '--slots', '150', '--context', '1024', '--tokens', '64', '--runs', '3',
            '--routing', 'locality-qwen3-30b-a3b', '--accept', '0.8', '--forced-depth', '$2',
            '--out', '$R/mtp_seed48_locality_$1_depth$2.json']
runpy.run_module('scripts.bench.bench_mtp', run_name='__main__')" > $R/mtp_seed48_locality_$1_depth$2.log 2>&1
  at "mtp seed48 locality $1 depth $2 rc=$?"; tail -1 $R/mtp_seed48_locality_$1_depth$2.log | cut -c1-600
}
device_ok=; grep -q "^mtp rc=0" $R/rcs && device_ok=1
for depth in 1 2; do
  mtp host $depth $((240 + 160 * depth)) ""
  [ -n "$device_ok" ] && mtp device $depth $((320 + 130 * depth)) "$DEVICE"
done
if [ $(left 580) -ge 60 ] && [ -n "$device_ok" ]; then
  timeout $(left 585) python3 -c "
import runpy, sys
$DEVICE
sys.argv = ['bench_mtp', 'runner/data/demo.gguf', '--slots', 'resident', '--context', '768', '--tokens', '128',
            '--runs', '5', '--accept', '0.8', '--forced-depth', '2', '--out', '$R/mtp_demo_resident_device.json']
runpy.run_module('scripts.bench.bench_mtp', run_name='__main__')" > $R/mtp_demo_resident_device.log 2>&1
  at "mtp demo resident device rc=$?"
fi
cd $OUT && tar czf r.tgz r && rm -rf r
