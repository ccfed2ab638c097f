# Session 4, call 3: decode attention split size sweep (seed and air shapes), attention GPU tests at 64 and 32,
# and resident / offload seed8 decode at the candidate split sizes.
export PYTHONUNBUFFERED=1 SHA=$(cat .devrun/sha)
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
D=$PWD/.devrun; cd .snap_head; export PYTHONPATH=/tmp/site:$PWD:$PWD/scripts
R=/root/k5; mkdir -p $R; pack() { (cd $R/.. && tar czf $OUT/results.tgz k5); }; trap pack EXIT
M=/root/seed8.gguf
[ -f $M ] || { python3 -m runner.cli synth $M --arch glm4moe --preset seed --quant Q4_K_M --layers 8 --jobs 16 > $R/synth.log 2>&1; echo synth rc=$?; }
for c in 64 32; do timeout 120 python3 $D/withchunk.py $c pytest -q -p no:cacheprovider tests/test_attention_cuda.py > $R/tests_attn_$c.log 2>&1; echo "attn tests $c rc=$?"; tail -1 $R/tests_attn_$c.log; done
for sh in seed air; do timeout 150 python3 scripts/bench_attention_cuda.py --shape $sh --kv-chunks 256,128,64,32 --decode-only --repeat 20 --commit $SHA --out $R/attn_$sh.json > $R/attn_$sh.log 2>&1; echo "attn bench $sh rc=$?"; pack; done
for c in 256 64 32; do timeout 100 python3 $D/withchunk.py $c scripts/bench_resident_cuda.py $M --out $R/resident_seed8_c$c.json --prefill-lengths 512 --decode-contexts 1024,8192 --runs 3 --decode-tokens 32 > $R/resident_c$c.log 2>&1; echo "resident $c rc=$?"; tail -c 300 $R/resident_c$c.log; pack; done
for c in 64 256; do timeout 100 python3 $D/withchunk.py $c scripts/bench_offload.py decode $M --slots 150 --contexts 1024,8192 --tokens 32 --runs 3 --commit $SHA-c$c --out $R/decode_seed8_150_c$c.json > /dev/null 2> $R/decode_c$c.err; echo "offload decode $c rc=$?"; pack; done
