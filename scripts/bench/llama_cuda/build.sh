#!/usr/bin/env bash
# llama.cpp with CUDA for the head-to-head (docs/perf/2026-12-03-offload-mtp-h2h-h200.md), built on a
# machine without a GPU and carried to the GPU box: the llama.cpp inside the llama-cpp-python sdist,
# sm_90 only, every CPU variant loaded at run time (GGML_BACKEND_DL), cuBLAS and the CUDA runtime
# linked dynamically (the box has them: pip's nvidia/cu13/lib), libcuda through a link-time stub.
# About 65 to 90 minutes on 2 cores. CUDA_ARCH (default 90, as the head-to-head ran) keeps PTX beside the
# sm_90 code: a 44 MB package (xz -9e); 90-real drops the PTX (same code on Hopper) for about 25 MB. Output:
# $WORK/llama-cuda-sm90.tar.xz holding pkg/bin/llama-bench, pkg/bin/llama-server (issue 24's serving benchmark)
# and the libraries they load. On the box: tar -xJf ...; LD_LIBRARY_PATH=<dir of libcublas.so.13> pkg/bin/llama-bench
set -euo pipefail
WORK=${WORK:-/tmp/llcuda}
VERSION=${LLAMA_CPP_PYTHON:-0.3.36}
CUBLAS=${CUBLAS:-nvidia-cublas==13.0.2.14}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$WORK" && cd "$WORK"
[ -d src ] || { python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d sdist;
                mkdir src && tar -xzf sdist/llama_cpp_python-$VERSION.tar.gz -C src --strip-components=1; }
X=$WORK/cudaextra; mkdir -p $X/include $X/lib64/stubs
if [ ! -e $X/lib64/libcublas.so ]; then  # cuBLAS headers and libraries from NVIDIA's wheel
  python3 -m pip download --no-deps --only-binary :all: "$CUBLAS" -d wheels
  python3 -m zipfile -e wheels/nvidia_cublas-*.whl wheels/cublas
  cp wheels/cublas/nvidia/cu13/include/* $X/include/
  cp -a wheels/cublas/nvidia/cu13/lib/libcublas*.so.* $X/lib64/
  for l in cublas cublasLt; do ln -sf lib$l.so.13 $X/lib64/lib$l.so; done
fi
[ -e $X/lib64/stubs/libcuda.so ] || gcc -shared -fPIC -I/usr/local/cuda/include -o $X/lib64/stubs/libcuda.so \
  -Wl,-soname,libcuda.so.1 "$HERE/cuda_stub.c"
cmake -S src/vendor/llama.cpp -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCUDAToolkit_ROOT=/usr/local/cuda \
  -DCUDA_cublas_LIBRARY=$X/lib64/libcublas.so -DCUDA_cublasLt_LIBRARY=$X/lib64/libcublasLt.so \
  -DCUDA_cuda_driver_LIBRARY=$X/lib64/stubs/libcuda.so -DCMAKE_CUDA_FLAGS="-I$X/include" -DCMAKE_CXX_FLAGS="-I$X/include" \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON \
  -DBUILD_SHARED_LIBS=ON -DGGML_CUDA_NCCL=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
cmake --build build -j "$(nproc)" --target llama-bench llama-server ggml-cuda
cmake --build build -j "$(nproc)"  # the CPU variants, loaded at run time
rm -rf pkg && mkdir -p pkg/bin
cp -a build/bin/llama-bench build/bin/libllama-bench-impl.so build/bin/llama-server build/bin/libllama-server-impl.so \
  build/bin/libmtmd.so* build/bin/libllama-common.so* build/bin/libllama.so* build/bin/libggml*.so* pkg/bin/
cp -L "$(gcc -print-file-name=libgomp.so.1)" pkg/bin/  # OpenMP runtime beside the CPU backends
for f in pkg/bin/*; do [ -L "$f" ] || strip --strip-unneeded "$f"; done
XZ_OPT="-9e -T$(nproc)" tar -cJf llama-cuda-sm90.tar.xz pkg
ls -la llama-cuda-sm90.tar.xz
