#!/usr/bin/env bash
set -u
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/gguf*.whl .whl/diskcache*.whl > $R/pip.log 2>&1
export PYTHONPATH=/tmp/site
cd .devrun/head
PYTHONPATH=/tmp/site:. timeout 100 python3 ../time_dir.py > $R/time_dir.json 2> $R/time_dir.err; echo "rc=$?"; cat $R/time_dir.json; tail -3 $R/time_dir.err
tail -30 $R/gpu_tests.log
cd $OUT && tar czf r.tgz r && rm -rf r
