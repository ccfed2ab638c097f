"""Time one MoE layer's device directory on the GPU (cuda/slot_directory.cu), as a directory decode graph runs it
at each layer of each token: the directory kernel and the fill kernel, with 0 to --top-k misses a step, and
the fill's GB/s beside cudaMemcpyAsync of the same bytes from the same pinned memory; JSON.

Usage: python -m scripts.bench.bench_directory_cuda [--experts 512] [--slots 150] [--top-k 10]
    [--expert-bytes 2039808] [--repeat 30] [--out bench.json]

The defaults are seed48's layer (512 experts of 2,039,808 bytes in Q4_K_M, top-10, 150 slots). Each step's ids
are chosen ahead on the host through the numpy twin of the directory (runner/offload/slot_directory.py, whose
choices the device's match by test) so that exactly `misses` of its k experts are not held, and uploaded
once; a launch is timed alone with CUDA events behind a spin kernel (bench_gemv_cuda's method: an empty
kernel measures about 3 us this way on an H100). The fill's GB/s is the misses' bytes over (serve time at m
misses - serve time at 0): the directory kernel's own time taken out.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import cupy as cp
import numpy as np

from runner.backends.cuda.slot_directory import DeviceDirectories
from runner.offload.slot_cache import LayerGeometry
from runner.offload.slot_directory import SlotDirectory
from scripts.bench.bench_gemv_cuda import empty_kernel_us, time_launches_us
from scripts.bench.common import environment, write_result


def full_directory(n_expert: int, n_slots: int) -> SlotDirectory:
    """A directory whose slots all hold experts (0..n_slots-1), as after a prompt's warm fill."""
    d = SlotDirectory(n_expert, n_slots)
    d.serve(np.arange(n_slots, dtype=np.int32).reshape(1, -1))
    return d


def step_ids(twin: SlotDirectory, k: int, misses: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """int32 [steps, k]: each step k distinct experts, `misses` of them not held when it runs (twin serves them)."""
    out = np.empty((steps, k), dtype=np.int32)
    for s in range(steps):
        held = np.flatnonzero(twin.slot_of >= 0)
        free = np.flatnonzero(twin.slot_of < 0)
        ids = np.concatenate([rng.choice(held, k - misses, replace=False), rng.choice(free, misses, replace=False)])
        out[s] = rng.permutation(ids)
        twin.serve(out[s : s + 1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", type=int, default=512)
    ap.add_argument("--slots", type=int, default=150)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--expert-bytes", type=int, default=2_039_808)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    assert args.repeat >= 20, "report at least 20 timed launches per case"
    n, slots, k, nbytes = args.experts, args.slots, args.top_k, args.expert_bytes
    host = np.frombuffer(cp.cuda.alloc_pinned_memory(n * nbytes), dtype=np.uint8, count=n * nbytes)
    host[:: 4096] = 1  # touch every page
    device = cp.empty(slots * nbytes, dtype=cp.uint8)
    geo = LayerGeometry(device.data.ptr, nbytes, (0, nbytes // 3, 2 * nbytes // 3), host.ctypes.data)
    directories = DeviceDirectories({0: (n, slots)}, "lru", {0: 1})
    rng = np.random.default_rng(0)
    report = {"environment": environment(argv=vars(args)), "repeat": args.repeat,
              "empty_kernel_us": empty_kernel_us(args.repeat), "cases": []}
    base_us = None
    for misses in range(k + 1):
        twin = full_directory(n, slots)
        directories.push({0: (twin.state(), geo)})
        ids = cp.asarray(step_ids(twin, k, misses, args.repeat + 1, rng))
        out = directories.pair_buffers(1, k)
        times = time_launches_us(lambda i: directories.serve(0, ids[i : i + 1], out), args.repeat)
        got = directories.pull()[0][1]
        assert got.misses == misses * (args.repeat + 1), f"{got.misses} misses, expected {misses} a step"
        serve_us = statistics.median(times)
        base_us = serve_us if misses == 0 else base_us
        case = {"misses": misses, "fill_bytes": misses * nbytes, "serve_median_us": round(serve_us, 2),
                "serve_min_us": round(min(times), 2), "serve_max_us": round(max(times), 2)}
        if misses:
            stream = cp.cuda.get_current_stream().ptr
            copy = time_launches_us(lambda i: [cp.cuda.runtime.memcpyAsync(
                device.data.ptr + j * nbytes, host.ctypes.data + (i * misses + j) % n * nbytes, nbytes,
                cp.cuda.runtime.memcpyHostToDevice, stream) for j in range(misses)], args.repeat)
            copy_us = statistics.median(copy)
            case.update(fill_GBps=round(misses * nbytes / ((serve_us - base_us) * 1e-6) / 1e9, 1),
                        memcpy_median_us=round(copy_us, 2),
                        memcpy_GBps=round(misses * nbytes / (copy_us * 1e-6) / 1e9, 1))
        print(json.dumps(case), flush=True)
        report["cases"].append(case)
    write_result(report, args.out)
    print(f"empty kernel {report['empty_kernel_us']} us; serve at 0 misses {base_us:.2f} us")


if __name__ == "__main__":
    main()
