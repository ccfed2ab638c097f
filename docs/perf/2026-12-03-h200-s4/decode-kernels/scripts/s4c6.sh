# Session 4, call 6: decode attention with the warp-parallel combine: tests at split 256 and 64, sweep, resident seed8.
export PYTHONUNBUFFERED=1 SHA=$(cat .devrun/sha)
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
D=$PWD/.devrun; cd .snap_head; export PYTHONPATH=/tmp/site:$PWD:$PWD/scripts
R=$OUT/k7; mkdir -p $R
M=/root/seed8.gguf
( python3 -m runner.cli synth $M --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 8 > $R/synth.log 2>&1 ) &
timeout 60 python3 -m pytest -x -q -p no:cacheprovider tests/test_attention_cuda.py > $R/tests_attn_256.log 2>&1; echo "attn tests 256 rc=$? at $SECONDS"; tail -1 $R/tests_attn_256.log
timeout 50 python3 $D/withchunk.py 64 pytest -x -q -p no:cacheprovider tests/test_attention_cuda.py > $R/tests_attn_64.log 2>&1; echo "attn tests 64 rc=$? at $SECONDS"; tail -1 $R/tests_attn_64.log
timeout 50 python3 scripts/bench_attention_cuda.py --shape seed --kv-chunks 256,128,64 --decode-only --repeat 20 --commit $SHA-combine --out $R/attn_seed.json > $R/attn_seed.log 2>&1; echo "attn bench seed rc=$? at $SECONDS"
[ $SECONDS -lt 120 ] && { timeout 30 python3 scripts/bench_attention_cuda.py --shape air --kv-chunks 256,64 --decode-only --repeat 20 --commit $SHA-combine --out $R/attn_air.json > $R/attn_air.log 2>&1; echo "attn bench air rc=$? at $SECONDS"; }
wait
for c in 256 64; do [ $SECONDS -lt 150 ] || break; timeout 30 python3 $D/withchunk.py $c scripts/bench_resident_cuda.py $M --out $R/resident_seed8_c$c.json --prefill-lengths 512 --decode-contexts 1024,8192,32768 --runs 3 --decode-tokens 32 > $R/resident_c$c.log 2>&1; echo "resident $c rc=$? at $SECONDS"; done
