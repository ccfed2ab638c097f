"""Throughput of runner.backends.cuda.dequant.dequantize on the GPU: GB/s of input bytes per type and output dtype, as JSON.

Usage: python -m scripts.bench.bench_dequant_cuda [--mib 64] [--repeat 5] [--out bench.json]
Each tensor holds about --mib MiB of random blocks in rows of 4096 values; one warm-up call is discarded,
then the median of --repeat calls timed with CUDA events is reported. total_GBps adds the bytes written.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import cupy
import numpy as np
from gguf.constants import GGML_QUANT_SIZES

from runner.backends.cuda.dequant import SUPPORTED_QTYPES, dequantize
from scripts.bench.common import environment

ROW = 4096  # a multiple of every block size


def time_call_s(fn, repeat: int) -> float:
    fn()  # warm-up (and the first compile), discarded
    times = []
    for _ in range(repeat):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return statistics.median(times)


def bench(qtype, target_bytes: int, repeat: int) -> dict[str, dict[str, float]]:
    block, type_size = GGML_QUANT_SIZES[qtype]
    row_bytes = ROW // block * type_size
    rows = max(1, target_bytes // row_bytes)
    # Random bytes: timing does not depend on the values (scales may be NaN or inf here).
    raw = cupy.random.randint(0, 256, size=(rows, row_bytes), dtype=cupy.int32).astype(cupy.uint8)
    result = {}
    for out_dtype in (np.float32, np.float16):
        seconds = time_call_s(lambda: dequantize(raw, qtype, ROW, out_dtype=out_dtype), repeat)
        out_bytes = rows * ROW * np.dtype(out_dtype).itemsize
        result[np.dtype(out_dtype).name] = {
            "ms": round(seconds * 1e3, 4),
            "input_GBps": round(raw.nbytes / seconds / 1e9, 1),
            "total_GBps": round((raw.nbytes + out_bytes) / seconds / 1e9, 1),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=64.0, help="input bytes per tensor, MiB")
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per type; the median is reported")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    target = int(args.mib * 2**20)
    report = {
        "environment": environment(argv=vars(args)),
        "input_MiB": args.mib,
        "row_length": ROW,
        "types": {qt.name: bench(qt, target, args.repeat) for qt in sorted(SUPPORTED_QTYPES)},
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
