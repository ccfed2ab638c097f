"""Compile the GEMV modules (cuda/gemv.cu, one per unit) in parallel processes; CuPy keeps each in its disk cache.

Usage: python -m scripts.bench.compile_gemv_cuda [--jobs 16] [--both-layouts] [--gate-up Q4_K,Q6_K ...]
Compiling them one after another in the first process that needs them takes about a minute; with
this, the tests and benchmarks that follow find every module compiled. --both-layouts adds each
type's other layout (gemv_cuda.LAYOUTS); --gate-up the modules of fused pairs of different types.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.cuda import gemv as gemv_cuda
from runner.backends.cuda.kernels import load_module


def compile_defines(defines: tuple[str, ...]) -> float:
    start = time.perf_counter()
    load_module("gemv", defines)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    parser.add_argument("--both-layouts", action="store_true", help="also each unit in its other layout")
    parser.add_argument("--gate-up", action="append", default=[], metavar="GATE,UP",
                        help="also the fused module of this pair of GGML type names")
    args = parser.parse_args()
    layouts = ("columns", "units") if args.both_layouts else (None,)
    work = [
        gemv_cuda.module_defines(qtype, row_length, layout)
        for qtype in sorted(gemv_cuda.SUPPORTED_QTYPES)
        for row_length in ((4096, 4097) if GGML_QUANT_SIZES[qtype][0] == 1 else (4096,))  # 4097: the one-value units
        for layout in layouts
    ]
    work += [gemv_cuda.gate_up_defines(QT[gate], QT[up], 4096) for gate, up in (p.split(",") for p in args.gate_up)]
    start = time.perf_counter()
    # spawn: each child sets up its own CUDA context (a forked one cannot).
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for defines, seconds in zip(work, pool.map(compile_defines, work)):
            print(f"{' '.join(defines)}: {seconds:.1f} s")
    print(f"{len(work)} modules in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
