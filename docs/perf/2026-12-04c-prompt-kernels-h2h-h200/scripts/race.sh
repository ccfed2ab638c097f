set -u
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
cd .devrun/head && cp ../race.py . && export PYTHONPATH=/tmp/site
for m in pass sync; do timeout 60 python3 race.py $m 2>&1 | tail -2; done
CS=$(ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || which compute-sanitizer)
echo "sanitizer: $CS"
[ -n "$CS" ] && timeout 150 $CS --tool memcheck --print-limit 5 python3 race.py pass 2>&1 | grep -v "^=========     " | head -40
[ -n "$CS" ] && timeout 150 $CS --tool racecheck --print-limit 5 python3 race.py pass 2>&1 | head -30
