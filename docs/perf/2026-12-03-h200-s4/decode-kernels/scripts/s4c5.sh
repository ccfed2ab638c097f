# Session 4, call 5: ncu split vs combine times of decode attention at split sizes 256 and 64.
export PYTHONUNBUFFERED=1
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
D=$PWD/.devrun; cd .snap_head; export PYTHONPATH=/tmp/site:$PWD
timeout 200 ncu --clock-control none --cache-control all --profile-from-start off --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active --csv python3 $D/attnprof.py > $OUT/ncu_attn.csv 2> $OUT/ncu_attn.err; echo rc=$?; tail -3 $OUT/ncu_attn.err
