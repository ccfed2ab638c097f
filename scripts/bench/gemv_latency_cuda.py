"""Why a small decode GEMV takes about 7 us beyond the launch (issue 20): seed48's q and k products (Q4_K, 2048 and
512 columns of 2048) timed as the decode graph runs them, many launches back to back in one CUDA graph, beside
probes with the same grid that only read the same bytes (a lane per row as the columns layout reads them, or
coalesced) or do nothing, the GEMV with the next launch's weights prefetched into L2 on a side branch, and the
units layout at fewer warps a block and one column a warp, and the columns layout at fewer threads a block
(gemv_cuda.COLUMNS_THREADS; more blocks on the SMs, the same bits). Each arm reads cold weights (the launches rotate over --rotate-mib of copies) or hot
ones (one copy, in L2). Per launch: the graph's GPU time over its launches. Writes JSON (MEASURING.md).

    python -m scripts.bench.gemv_latency_cuda --out gemv_latency.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import cupy as cp
import numpy as np
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.cuda import gemv as gemv_cuda
from runner.backends.cuda.gemv import gemv
from scripts.bench.bench_gemv_cuda import random_bytes, row_bytes
from scripts.bench.common import environment

# Reads every byte a columns-layout tile reads (lane c: row col0 + c, warp s: its slice of the row) with 16-byte
# loads, all issued before any is used, and writes one word a lane so nothing is dropped. COALESCED: the CTA's
# threads read the tile's bytes in order instead (the same bytes, neighbouring lanes neighbouring chunks).
_PROBES = r"""
extern "C" __global__ void read_rows(const uint4* w, long long row_chunks, int n, unsigned* out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int row = min(blockIdx.x * 32 + lane, n - 1);
    const int per = (int)((row_chunks + warps - 1) / warps), c0 = warp * per, c1 = min((int)row_chunks, c0 + per);
    const uint4* p = w + row * row_chunks;
    unsigned acc = 0;
    for (int base = c0; base < c1; base += 16) {  // 16 loads in flight, then used
        uint4 v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) if (base + i < c1) v[i] = __ldg(p + base + i);
#pragma unroll
        for (int i = 0; i < 16; ++i) if (base + i < c1) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
extern "C" __global__ void read_coalesced(const uint4* w, long long row_chunks, int n, unsigned* out) {
    const long long first = (long long)blockIdx.x * 32 * row_chunks, last = min((long long)n * row_chunks,
                                                                               first + 32 * row_chunks);
    unsigned acc = 0;
    for (long long base = first + threadIdx.x; base < last; base += 16ll * blockDim.x) {
        uint4 v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) if (base + (long long)i * blockDim.x < last) v[i] = __ldg(w + base + (long long)i * blockDim.x);
#pragma unroll
        for (int i = 0; i < 16; ++i) if (base + (long long)i * blockDim.x < last) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
extern "C" __global__ void nothing(const uint4*, long long, int, unsigned*) {}
// The next launch's weights into L2 while this one runs (sm_90 bulk prefetch: one instruction per 64 KiB).
extern "C" __global__ void prefetch_l2(const char* w, long long bytes) {
    for (long long off = (long long)threadIdx.x << 16; off < bytes; off += (long long)blockDim.x << 16) {
        const unsigned size = (unsigned)min(bytes - off, 65536ll);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(w + off), "r"(size) : "memory");
    }
}
"""
# seed48's q/o, k, v and router; then one matrix of as many columns as the 11 pairs' gate and up (N 512 each) and
# their down (N 2048, K 512) hold, stand-ins for the expert launches
CASES = [(QT.Q4_K, 2048, 2048), (QT.Q4_K, 512, 2048), (QT.Q6_K, 512, 2048), (QT.F32, 512, 2048),
         (QT.Q4_K, 11264, 2048), (QT.Q4_K, 22528, 512)]
# units layout arms (warps a block, columns a warp) beside the "gemv units" arm's (16, 2)
UNITS_SHAPES = ((8, 2), (4, 2), (2, 2), (8, 1), (4, 1))
COLUMNS_THREADS = (256, 128, 64)  # the columns layout's CTA sizes timed beside its 512


def graph_us_per_launch(launch, launches: int, replays: int, prefetch=None) -> list[float]:
    """Capture launch(0..launches-1) in one graph; time `replays` replays after one warm-up: us per launch.
    prefetch(i), when given, runs on a side branch of the graph beside launch(i - 1), joined before launch(i)."""
    stream, side = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with stream:
        launch(0)  # compile outside the capture
        if prefetch is not None:
            prefetch(0)
        stream.synchronize()
        stream.begin_capture()
        joined = None
        for i in range(launches):
            if prefetch is not None:
                forked = stream.record()
                side.wait_event(forked)
                with side:
                    prefetch(i + 1)
                if joined is not None:
                    stream.wait_event(joined)
                joined = side.record()
            launch(i)
        if joined is not None:
            stream.wait_event(joined)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        times = []
        for _ in range(replays):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) * 1e3 / launches)
    return times


def arms(qtype: QT, n: int, k: int, rotate_bytes: int, probes: cp.RawModule):
    """(name, temperature, launch, prefetch or None) for every arm of one matrix shape."""
    rb = row_bytes(qtype, k)
    assert rb % 16 == 0, "the probes read 16-byte chunks"
    cold = [random_bytes(n, k, qtype) for _ in range(max(1, rotate_bytes // (n * rb)))]
    x = cp.random.standard_normal((1, k), dtype=cp.float32)
    y = cp.empty((1, n), cp.float32)
    sink = cp.empty(-(-n // 32) * 512, cp.uint32)
    grid = (-(-n // 32),)

    def run_gemv(copies, layout, warps=16, warp_columns=2, threads=512):
        def run(i):
            gemv_cuda.LAYOUTS[qtype], gemv_cuda.UNITS_WARPS, gemv_cuda.UNITS_WARP_COLUMNS = layout, warps, warp_columns
            gemv_cuda.COLUMNS_THREADS = threads
            gemv(x, copies[i % len(copies)], qtype, k, out=y)
        return run

    for temperature, copies in (("cold", cold), ("hot", cold[:1])):
        for layout in ("columns", "units"):
            yield f"gemv {layout}", temperature, run_gemv(copies, layout), None
        for threads in COLUMNS_THREADS:
            yield (f"gemv columns, {threads} threads a block", temperature,
                   run_gemv(copies, "columns", threads=threads), None)
        for warps, warp_columns in UNITS_SHAPES:
            yield (f"gemv units, {warps} warps of {warp_columns} columns a block", temperature,
                   run_gemv(copies, "units", warps, warp_columns), None)
        if temperature == "cold":
            prefetch_l2 = probes.get_function("prefetch_l2")

            def prefetch(i, copies=copies):
                w = copies[i % len(copies)]
                prefetch_l2((1,), (64,), (w, np.int64(w.nbytes)))
            yield "gemv columns, next prefetched to L2", temperature, run_gemv(copies, "columns"), prefetch
        for name in ("read_rows", "read_coalesced", "nothing"):
            kernel = probes.get_function(name)
            yield name, temperature, (lambda i, kernel=kernel, copies=copies: kernel(
                grid, (512,), (copies[i % len(copies)], np.int64(rb // 16), np.int32(n), sink))), None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=64, help="launches captured in one graph")
    ap.add_argument("--replays", type=int, default=20, help="timed replays of the graph (after one warm-up)")
    ap.add_argument("--rotate-mib", type=float, default=256.0, help="cold arms: weight bytes rotated over")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    probes = cp.RawModule(code=_PROBES)
    chosen = dict(gemv_cuda.LAYOUTS)
    cases = []
    for qtype, n, k in CASES:
        for name, temperature, launch, prefetch in arms(qtype, n, k, int(args.rotate_mib * 2**20), probes):
            times = graph_us_per_launch(launch, args.launches, args.replays, prefetch)
            entry = {"arm": name, "weights": temperature, "qtype": qtype.name, "N": n, "K": k,
                     "bytes": n * row_bytes(qtype, k), "us_per_launch": round(statistics.median(times), 3),
                     "min_us": round(min(times), 3), "max_us": round(max(times), 3)}
            print(json.dumps(entry), flush=True)
            cases.append(entry)
        gemv_cuda.LAYOUTS.update(chosen)
        gemv_cuda.UNITS_WARPS, gemv_cuda.UNITS_WARP_COLUMNS, gemv_cuda.COLUMNS_THREADS = 16, 2, 512
    report = {"benchmark": "gemv_latency_cuda", "environment": environment(argv=vars(args)),
              "method": "one CUDA graph of --launches launches, timed by events around each replay; us a launch",
              "cases": cases}
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
