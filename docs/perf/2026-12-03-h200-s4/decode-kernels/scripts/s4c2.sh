# Session 4, call 2: where a decode token's GPU time goes (resident seed8: graph node count and GPU time per
# token; ncu per-kernel durations of one eager token).
export PYTHONUNBUFFERED=1 SHA=$(cat .devrun/sha)
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
D=$PWD/.devrun; cd .snap_head; export PYTHONPATH=/tmp/site:$PWD
R=/root/k4; mkdir -p $R; pack() { (cd $R/.. && tar czf $OUT/results.tgz k4); }; trap pack EXIT
ls -la /root/models 2>/dev/null
M=/root/seed8.gguf
python3 -m runner.cli synth $M --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 16 > $R/synth.log 2>&1; echo synth rc=$?
timeout 200 python3 scripts/bench_resident_cuda.py $M --out $R/resident_seed8.json --prefill-lengths 512 --decode-contexts 1024 --runs 3 --decode-tokens 32 > $R/resident.log 2>&1; echo resident rc=$?; tail -c 1500 $R/resident.log
which ncu; timeout 240 ncu --clock-control none --cache-control none --profile-from-start off --metrics gpu__time_duration.sum --csv python3 $D/kprof.py $M > $R/ncu.csv 2> $R/ncu.err; echo ncu rc=$?; tail -5 $R/ncu.err; wc -l $R/ncu.csv
timeout 150 python3 scripts/bench_offload.py decode $M --slots 150 --contexts 1024 --tokens 32 --runs 3 --commit $SHA --out $R/decode_seed8_150.json > /dev/null 2> $R/decode.err; echo decode rc=$?
