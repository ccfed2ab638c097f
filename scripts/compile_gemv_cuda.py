"""Compile the GEMV modules (cuda/gemv.cu, one per unit) in parallel processes; CuPy keeps each in its disk cache.

Usage: python scripts/compile_gemv_cuda.py [--jobs 16] [--gate-up Q4_K,Q6_K ...]
Compiling them one after another in the first process that needs them takes about a minute; with
this, the tests and benchmarks that follow find every module compiled. --gate-up adds the modules
of fused gate/up pairs of different types.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gguf.constants import GGMLQuantizationType as QT  # noqa: E402

from runner import gemv_cuda  # noqa: E402
from runner.cuda_kernels import load_module  # noqa: E402


def compile_defines(defines: tuple[str, ...]) -> float:
    start = time.perf_counter()
    load_module("gemv", defines)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    parser.add_argument("--gate-up", action="append", default=[], metavar="GATE,UP",
                        help="also the fused module of this pair of GGML type names")
    args = parser.parse_args()
    work = [(f"GEMV_UNIT={unit}",) for unit in gemv_cuda.ALL_UNITS]
    for pair in args.gate_up:
        gate, up = (gemv_cuda.unit_name(QT[name], 4096) for name in pair.split(","))
        work.append((f"GATE_UNIT={gate}", f"UP_UNIT={up}"))
    start = time.perf_counter()
    # spawn: each child sets up its own CUDA context (a forked one cannot).
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for defines, seconds in zip(work, pool.map(compile_defines, work)):
            print(f"{' '.join(defines)}: {seconds:.1f} s")
    print(f"{len(work)} modules in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
