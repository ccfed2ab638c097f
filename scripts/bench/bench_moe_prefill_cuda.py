"""Speed of the prompt path's tensor-core GEMMs (cuda/moe_prefill.cu: moe_gate_up, moe_down, linear_rows) on the
GPU, and with --against, of an older moe_prefill.cu on the same inputs, with a bit-for-bit comparison; JSON out.

    python -m scripts.bench.bench_moe_prefill_cuda --out bench.json [--repeat 20] [--commit SHA]
        [--against REV_OR_FILE] [--moe-tokens 2048,8192,32768] [--linear-tokens 2048,8192,16384]

Experts: 512 experts of gate and up [512, 2048] and down [2048, 512] in fp16 (the seed model's shapes), each
token routed to 10 distinct random experts, every expert in one chunk (slot = expert id), the two kernels
called directly (no dequantization, no combine). Linear: x [T, K] float32 times w [N, K] fp16 for (K, N) in
(2048, 2048), (2048, 512), (2048, 4096). TFLOP/s counts 2 P (2 n_ff) n_embd for gate/up (P = T k pairs),
2 P n_embd n_ff for down, 2 T N K for linear.

--against: a file, or a git revision whose cuda/moe_prefill.cu `git show` reads, compiled with CuPy and
launched with its own geometry: 64 x 64 tiles, 128 threads, grid (tiles, column tiles), static shared memory
when its source has `#define MP_THREADS 128` (the 4-warp kernels), else this checkout's. Each shape then
reports both times, the speedup and whether the raw outputs (h, y, out) are equal bit for bit.

Without git on the GPU machine, write the old source into the tree first (git show REV:cuda/moe_prefill.cu >
old_moe_prefill.cu) and pass the file. Timing: one warm-up call discarded; a spin kernel holds the GPU while
the host enqueues the timed calls, so CUDA events around each call measure GPU time; median, min and max of
--repeat. The record also carries each kernel's registers and local (spill) bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import cupy as cp
import numpy as np

from runner.backends.cuda import gemm
from runner.backends.cuda import moe_prefill as mp
from runner.backends.cuda.kernels import load_module
from scripts.bench.common import environment, older_kernel, write_result

N_EXPERT, TOP_K, N_EMBD, N_FF = 512, 10, 2048, 512
LINEAR_KN = ((2048, 2048), (2048, 512), (2048, 4096))
LEGACY_TILE, LEGACY_THREADS = 64, 128
KERNELS = ("moe_gate_up", "moe_down", "linear_rows", "linear_rows_64")
SPIN = cp.RawKernel(r"""
extern "C" __global__ void spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {}
}""", "spin")


def summary_ms(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 5), "min": round(min(values), 5),
            "max": round(max(values), 5), "n": len(values)}


def time_calls_ms(fn, repeat: int) -> list[float]:
    """GPU time of each of `repeat` calls of fn, after one discarded warm-up call."""
    fn()
    cp.cuda.get_current_stream().synchronize()
    starts, stops = [cp.cuda.Event() for _ in range(repeat)], [cp.cuda.Event() for _ in range(repeat)]
    SPIN((1,), (1,), (np.int64(200_000_000),))  # ~100 ms: the host enqueues every call meanwhile
    for start, stop in zip(starts, stops):
        start.record()
        fn()
        stop.record()
    stops[-1].synchronize()
    return [cp.cuda.get_elapsed_time(a, b) for a, b in zip(starts, stops)]


@dataclass
class Arm:
    """One moe_prefill.cu, compiled, with the launch geometry its kernels expect."""

    name: str
    module: cp.RawModule
    legacy: bool  # the 4-warp kernels: 64 x 64 tiles, 128 threads, grid (row tiles, column tiles)
    kernels: dict = field(default_factory=dict)

    def kernel(self, name: str, shared: int) -> cp.RawKernel:
        if name not in self.kernels:
            self.kernels[name] = self.module.get_function(name)
            if shared:
                self.kernels[name].max_dynamic_shared_size_bytes = shared
        return self.kernels[name]

    def gate_up(self, x, order, tiles, g16, u16, h) -> None:
        n_ff, width = g16.shape[1:]
        args = (x, order, np.int32(TOP_K), tiles, g16, u16, np.int32(n_ff), np.int32(width), np.int32(0), h)
        if self.legacy:
            grid = (len(tiles), -(-n_ff // LEGACY_TILE))
            self.kernel("moe_gate_up", 0)(grid, (LEGACY_THREADS,), args)
        else:
            shared = mp.tile_shared_bytes(mp.PAIR_TILE_ROWS, 2 * mp.GATE_UP_TILE_COLS)
            grid = (len(tiles) * -(-n_ff // mp.GATE_UP_TILE_COLS),)
            self.kernel("moe_gate_up", shared)(grid, (mp.MP_THREADS,), args, shared_mem=shared)

    def down(self, h, tiles, d16, y) -> None:
        n_out, n_ff = d16.shape[1:]
        args = (h, tiles, d16, np.int32(n_out), np.int32(n_ff), np.int32(0), y)
        if self.legacy:
            self.kernel("moe_down", 0)((len(tiles), -(-n_out // LEGACY_TILE)), (LEGACY_THREADS,), args)
        else:
            shared = mp.tile_shared_bytes(mp.PAIR_TILE_ROWS, mp.DOWN_TILE_COLS)
            grid = (len(tiles) * -(-n_out // mp.DOWN_TILE_COLS),)
            self.kernel("moe_down", shared)(grid, (mp.MP_THREADS,), args, shared_mem=shared)

    def linear(self, x, w16, out) -> str:
        """out = x w16^T; the kernel it launched."""
        (t, k), n = x.shape, w16.shape[0]
        args = (x, w16, np.int32(t), np.int32(n), np.int32(k), out)
        if self.legacy:
            grid = (-(-t // LEGACY_TILE), -(-n // LEGACY_TILE))
            self.kernel("linear_rows", 0)(grid, (LEGACY_THREADS,), args)
            return "linear_rows"
        rows = gemm.row_tile(t, n)
        name = "linear_rows" if rows == gemm.ROW_TILE else "linear_rows_64"
        shared = mp.tile_shared_bytes(rows, gemm.COL_TILE)
        grid = (-(-t // rows) * -(-n // gemm.COL_TILE),)
        self.kernel(name, shared)(grid, (mp.MP_THREADS,), args, shared_mem=shared)
        return name

    def attributes(self) -> dict:
        got = {}
        for name in KERNELS:
            try:
                a = self.module.get_function(name).attributes
            except Exception:  # the old source has no linear_rows_64
                continue
            got[name] = {key: a[key] for key in ("num_regs", "local_size_bytes", "shared_size_bytes") if key in a}
        return got


def arm_from(against: str) -> Arm:
    """The older moe_prefill.cu named by a path or a git revision."""
    source, module = older_kernel(against, "moe_prefill")
    return Arm(against, module, legacy="#define MP_THREADS 128" in source)


def moe_inputs(t: int) -> tuple:
    """x, order, tiles (slot = expert id) and empty h, y for T tokens routed to TOP_K random experts each."""
    x = cp.random.standard_normal((t, N_EMBD), dtype=cp.float32)
    ids = cp.argsort(cp.random.random((t, N_EXPERT), dtype=cp.float32), axis=1)[:, :TOP_K].astype(cp.int32)
    order, offsets_dev = mp.group_by_expert(ids, N_EXPERT)
    offsets = cp.asnumpy(offsets_dev)
    active = np.nonzero(np.diff(offsets))[0]
    tiles = mp.pair_tiles(offsets, active)
    tiles[:, 0] = active[tiles[:, 0]]
    return x, order, cp.asarray(tiles)


def expert_weights(rows: int, cols: int) -> cp.ndarray:
    w = cp.random.standard_normal((N_EXPERT, rows, cols), dtype=cp.float32)
    w *= 0.05
    return w.astype(cp.float16)


def timed(fn, repeat: int, flops: float) -> dict:
    ms = summary_ms(time_calls_ms(fn, repeat))
    return {"ms": ms, "TFLOPs": round(flops / (ms["median"] * 1e-3) / 1e12, 1)}


def compare(row: dict, new: dict, old: dict, outputs: dict) -> None:
    row["new"], row["old"] = new, old
    row["speedup"] = round(old["ms"]["median"] / new["ms"]["median"], 2)
    row["bit_identical"] = {name: bool(cp.array_equal(a, b)) for name, (a, b) in outputs.items()}


def bench_moe(arms: list[Arm], tokens: list[int], repeat: int) -> list[dict]:
    g16, u16, d16 = expert_weights(N_FF, N_EMBD), expert_weights(N_FF, N_EMBD), expert_weights(N_EMBD, N_FF)
    rows = []
    for t in tokens:
        x, order, tiles = moe_inputs(t)
        pairs = t * TOP_K
        outs = []
        for arm in arms:
            h = cp.empty((pairs, N_FF), dtype=cp.float16)
            y = cp.empty((pairs, N_EMBD), dtype=cp.float32)
            gu = timed(lambda: arm.gate_up(x, order, tiles, g16, u16, h), repeat, 2 * pairs * 2 * N_FF * N_EMBD)
            dn = timed(lambda: arm.down(h, tiles, d16, y), repeat, 2 * pairs * N_EMBD * N_FF)
            outs.append(({"gate_up": gu, "down": dn}, h, y))
        row = {"T": t, "pairs": pairs, "tiles": len(tiles), **outs[0][0]}
        if len(arms) > 1:
            for kernel, out in (("gate_up", 1), ("down", 2)):
                row[kernel] = {}
                compare(row[kernel], outs[0][0][kernel], outs[1][0][kernel], {kernel: (outs[0][out], outs[1][out])})
        total = [sum(o[0][k]["ms"]["median"] for k in ("gate_up", "down")) for o in outs]
        row["both_ms"] = [round(v, 4) for v in total]
        row["both_TFLOPs"] = [round(6 * pairs * N_FF * N_EMBD / (v * 1e-3) / 1e12, 1) for v in total]
        rows.append(row)
        print(json.dumps(row), flush=True)
        del outs
    return rows


def bench_linear(arms: list[Arm], tokens: list[int], repeat: int) -> list[dict]:
    rows = []
    for t in tokens:
        for k, n in LINEAR_KN:
            x = cp.random.standard_normal((t, k), dtype=cp.float32)
            w16 = (0.05 * cp.random.standard_normal((n, k), dtype=cp.float32)).astype(cp.float16)
            results, kernels = [], []
            for arm in arms:
                out = cp.empty((t, n), dtype=cp.float32)
                kernels.append(arm.linear(x, w16, out))
                results.append((timed(lambda: arm.linear(x, w16, out), repeat, 2 * t * n * k), out))
            row = {"T": t, "K": k, "N": n, "kernel": kernels[0], **results[0][0]}
            if len(arms) > 1:
                compare(row, results[0][0], results[1][0], {"out": (results[0][1], results[1][1])})
                del row["ms"], row["TFLOPs"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per case")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here")
    parser.add_argument("--commit", default=None, help="the commit measured (default: the checkout's)")
    parser.add_argument("--against", default=None, help="an older moe_prefill.cu: a path or a git revision")
    parser.add_argument("--moe-tokens", default="2048,8192,32768", help="tokens of the expert cases ('' for none)")
    parser.add_argument("--linear-tokens", default="2048,8192,16384", help="rows of the dense cases ('' for none)")
    args = parser.parse_args()
    cp.random.seed(0)
    arms = [Arm("checkout", load_module("moe_prefill"), legacy=False)]
    if args.against:
        arms.append(arm_from(args.against))
    tokens = lambda text: [int(v) for v in text.split(",") if v]  # noqa: E731
    result = {"environment": environment(args.commit, vars(args)), "repeat": args.repeat,
              "arms": [a.name for a in arms]}
    result["moe"] = bench_moe(arms, tokens(args.moe_tokens), args.repeat)
    result["linear"] = bench_linear(arms, tokens(args.linear_tokens), args.repeat)
    result["kernels"] = {a.name: a.attributes() for a in arms}
    write_result(result, args.out)


if __name__ == "__main__":
    main()
