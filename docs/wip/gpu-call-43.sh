#!/usr/bin/env bash
# Issue 20 (2026-12-07h): gpu-call-42 cut to 300 s for a session left with little device time: PDL's GPU tests while
# seed48 synthesizes, then resident seed48 main and pdl alternated, three processes each (bench_resident_cuda).
#   run: CALL_S=300 bash docs/wip/gpu-call-43.sh    carry: [".whl"]    timeout_s 300
source docs/wip/device-env.sh
setup_box
seed48
timeout $(left 480) python3 -m pytest -q tests/test_pdl_cuda.py > $R/pytest_pdl.log 2>&1; echo "pdl rc=$?" >> $R/rcs
wait
at "tests and synth"; cat $R/rcs; tail -n 2 $R/pytest_pdl.log
for i in 1 2 3; do
  resident main ""
  grep -q "^pdl rc=0" $R/rcs && resident pdl "import runner.backends.cuda.launch as l
l.PDL = True"
done
cd $OUT && tar czf r.tgz r && rm -rf r
