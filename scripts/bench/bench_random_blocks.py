"""Throughput of runner.synth.random_blocks.random_tensor: MB/s of output per type, one core, as JSON.

Usage: python -m scripts.bench.bench_random_blocks [--mb 64] [--repeat 3] [--types Q4_K,Q6_K]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT

from runner.synth.random_blocks import DIRECT_QTYPES, random_tensor

ROW = 4096  # a multiple of every block size


def bench(qt: QT, target_bytes: int, repeat: int) -> dict[str, float]:
    block, type_size = GGML_QUANT_SIZES[qt]
    rows = max(1, target_bytes // (ROW // block * type_size))
    random_tensor(np.random.default_rng(0), qt, (1, ROW), 0.02)  # calibration and tables, not timed
    best = float("inf")
    for i in range(repeat):
        rng = np.random.default_rng(i)
        start = time.perf_counter()
        data = random_tensor(rng, qt, (rows, ROW), 0.02)
        best = min(best, time.perf_counter() - start)
    return {"MB": round(data.nbytes / 1e6, 1), "seconds": round(best, 4), "MB_per_s": round(data.nbytes / 1e6 / best)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=64.0, help="output size per tensor, MiB")
    parser.add_argument("--repeat", type=int, default=3, help="runs per type; the fastest is reported")
    parser.add_argument("--types", default="", help="comma-separated type names (default: all direct types)")
    args = parser.parse_args()
    types = [QT[n.strip().upper()] for n in args.types.split(",") if n.strip()] or sorted(
        DIRECT_QTYPES, key=lambda t: t.value
    )
    results = {qt.name: bench(qt, int(args.mb * (1 << 20)), args.repeat) for qt in types}
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
