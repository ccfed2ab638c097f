"""Speed of runner.backends.cuda.route (route, combine), moe_prefill.group_by_expert and the logits' way to the
host sampler (the full copy; a device argmax beside it) on the GPU; JSON out.

    python -m scripts.bench.bench_moe_sample_cuda --out bench.json [--repeat 50] [--commit SHA]

gpu_us: CUDA events around each call while a spin kernel holds the GPU, so launch gaps from Python
are not counted (for the device-only functions). call_us: host wall time per call with a sync
after each, the cost as seen from Python (launch overhead and, for the logits rows, the
device-to-host copy included). Medians of --repeat calls after one warm-up. The GPU sampling functions
and moe.py's counting-sort grouping this once timed are gone (docs/perf/2026-12-02-moe-sample-cuda-h200.md
has their figures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import cupy as cp
import numpy as np

from runner.backends.cuda import route as route_cuda
from runner.backends.cuda.moe_prefill import group_by_expert
from scripts.bench.common import environment

SPIN = cp.RawKernel(r"""
extern "C" __global__ void spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {}
}""", "spin")


def gpu_us(fn, repeat: int) -> float:
    fn()
    cp.cuda.get_current_stream().synchronize()
    events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(repeat)]
    SPIN((1,), (1,), (np.int64(50_000_000),))
    for start, stop in events:
        start.record()
        fn()
        stop.record()
    events[-1][1].synchronize()
    return round(statistics.median(cp.cuda.get_elapsed_time(a, b) for a, b in events) * 1000, 2)


def call_us(fn, repeat: int) -> float:
    fn()
    stream = cp.cuda.get_current_stream()
    stream.synchronize()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        stream.synchronize()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1e6, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--commit", default=None, help="default: the checkout's")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []

    def record(name: str, fn, device_only: bool = True, **setup) -> None:
        row = {"name": name, **setup, "call_us": call_us(fn, args.repeat)}
        if device_only:
            row["gpu_us"] = gpu_us(fn, args.repeat)
        rows.append(row)
        print(row, flush=True)

    for n_tok in (1, 8, 2048):
        for n_expert, k, gating, groups in ((128, 8, "softmax", 0), (128, 8, "sigmoid", 0), (512, 10, "sigmoid", 0),
                                            (256, 8, "sigmoid", 8)):
            logits = cp.asarray(rng.standard_normal((n_tok, n_expert)).astype(np.float32))
            bias = cp.asarray(rng.standard_normal(n_expert).astype(np.float32) * 0.1) if gating == "sigmoid" else None
            record("route", lambda: route_cuda.route(logits, bias, gating, k, groups, 4, True, 2.5),
                   T=n_tok, E=n_expert, k=k, gating=gating, groups=groups)
    for n_tok, k, d in ((1, 10, 2048), (8, 10, 2048), (1, 8, 4096), (2048, 10, 2048)):
        y = cp.asarray(rng.standard_normal((n_tok * k, d)).astype(np.float32))
        w = cp.asarray(rng.random((n_tok, k)).astype(np.float32))
        record("combine", lambda: route_cuda.combine(y, w), T=n_tok, k=k, d=d)
    for n_tok, n_expert, k in ((512, 128, 8), (2048, 128, 8), (2048, 512, 10), (8192, 512, 10)):
        ids = cp.asarray(np.argsort(rng.random((n_tok, n_expert)), axis=1)[:, :k].astype(np.int32))
        record("moe_prefill.group_by_expert", lambda: group_by_expert(ids, n_expert), T=n_tok, E=n_expert, k=k)
    for v in (151552, 262144):
        x = cp.asarray(rng.standard_normal(v).astype(np.float32))
        record("argmax_cupy_int", lambda: int(cp.argmax(x)), device_only=False, V=v)
        record("full_logits_to_host", lambda: x.get(), device_only=False, V=v)

    Path(args.out).write_text(json.dumps({
        "environment": environment(args.commit, vars(args)), "repeat": args.repeat, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
