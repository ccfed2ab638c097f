#!/usr/bin/env bash
# The wheels the GPU box lacks (it has CuPy, numpy, click, jinja2, psutil, prometheus-client, httpx, pytest),
# for Python 3.12 x86-64, into .whl/ (ignored by git; carry it), plus llama-cpp-python built here for any
# AVX2 x86 as a tarball (the tests' tokenizer needs it; a build on the box costs a minute of device time).
# A new checkout does not have .whl: run this first (about 1 minute, or 6 with the llama_cpp build).
#   bash scripts/bench/box_wheels.sh [path to a built llama_cpp package dir]
# On the box: docs/wip/device-env.sh's setup_box installs them into /tmp/site and /tmp/llsite.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || grep -q "^/.whl/" .gitignore || echo /.whl/ >> .git/info/exclude
PLAT="--platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
# runtime: gguf, the server (fastapi, pydantic, uvicorn), constrained decoding, llama_cpp's own import;
# tests: the openai SDK (openai 3.x needs httpx2), jsonschema, pexpect. The anthropic SDK (2.9 MB, for the server's
# Anthropic-format tests only) goes to .whl-extra/: with .llcuda, .whl and the tree are at the device's 64 MiB carry
# limit; carry .whl-extra where a call runs those tests (setup_box installs it when present).
NAMES="gguf fastapi starlette pydantic pydantic-core annotated-types typing-inspection typing-extensions anyio uvicorn
  llguidance diskcache openai distro jiter sniffio httpx2 httpcore2 truststore idna opentelemetry-api
  docstring-parser jsonschema jsonschema-specifications referencing rpds-py pexpect ptyprocess"
mkdir -p .whl-extra
grep -qx "/.whl-extra/" .git/info/exclude 2>/dev/null || echo /.whl-extra/ >> .git/info/exclude
for n in $NAMES anthropic; do
  [ "$n" = anthropic ] && to=.whl-extra || to=.whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT -d $to "$n"
done
# pydantic pins pydantic-core exactly: fetch the pinned one if the newest differs
core=$(unzip -p .whl/pydantic-[0-9]*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p')
ls .whl/pydantic_core-"$core"-* > /dev/null 2>&1 || { rm -f .whl/pydantic_core-*;
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT -d .whl "pydantic-core==$core"; }
LL=${1:-}
if [ -z "$LL" ]; then  # build llama-cpp-python portably (about 5 minutes on 2 cores)
  T=$(mktemp -d)
  CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
    python3 -m pip install -q --no-deps --target "$T" "llama-cpp-python==0.3.36"
  LL=$T/llama_cpp
fi
S=$(mktemp -d) && cp -a "$LL" "$S/llama_cpp" && find "$S" -name __pycache__ -prune -exec rm -rf {} +
strip --strip-unneeded "$S"/llama_cpp/lib/*.so* 2> /dev/null || true
XZ_OPT=-9 tar -cJf .whl/llama_cpp-0.3.36-avx2.tar.xz -C "$S" llama_cpp
du -sh .whl
