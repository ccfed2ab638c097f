#!/usr/bin/env bash
# The CUDA-marked tests at a committed snapshot (.devrun/head, git archive HEAD), and their count at 20e98ef (the layout change's base, in .devrun/old).
set -u
export PYTHONUNBUFFERED=1
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1 || { tail -20 $OUT/pip.log; exit 1; }
mkdir -p /tmp/ll && tar xzf .whl/llama_cpp_python-0.3.36-src.tgz -C /tmp/ll
t0=$(date +%s)
[ -d /tmp/llsite/llama_cpp ] || CMAKE_ARGS="-DLLAVA_BUILD=OFF" python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/llsite /tmp/ll/llama_cpp_python-0.3.36 > $OUT/llama_build.log 2>&1
echo "llama build rc=$? in $(( $(date +%s) - t0 )) s"
export PYTHONPATH=/tmp/site:/tmp/llsite
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"; python3 --version; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
cuda_files() { grep -l "mark.cuda" tests/*.py | tr '\n' ' '; }
(cd .devrun/old && timeout 150 python3 -m pytest --collect-only -q -p no:cacheprovider $(cuda_files) > $OUT/collect_old.txt 2>&1)
(cd .devrun/head && timeout 150 python3 -m pytest --collect-only -q -p no:cacheprovider $(cuda_files) > $OUT/collect_new.txt 2>&1)
for f in $OUT/collect_old.txt $OUT/collect_new.txt; do echo "$f: $(tail -1 $f)"; done
(cd .devrun/head && timeout ${SUITE_S:-420} python3 -m pytest -q -p no:cacheprovider $(cuda_files) > $OUT/gpu_tests.log 2>&1; echo "tests rc=$?")
tail -25 $OUT/gpu_tests.log
