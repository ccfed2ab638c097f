"""Speed of runner.backends.cuda.attention.attention on the GPU (GLM-4.5-Air attention: H=96, Hkv=8, D=128; or the
seed preset's: H=16, Hkv=4, D=128); JSON out.

    python -m scripts.bench.bench_attention_cuda --out bench.json [--repeat 30] [--commit SHA] [--shape air|seed]
        [--kv-chunks 256,64] [--dec-slots 4,1] [--decode-split tiles,keys] [--flash-f16-keys 64,32]
        [--decode-only | --prefill-only] [--against REV_OR_FILE]

--kv-chunks times decode at each split size (attention_cuda.KV_CHUNK, compiled into the kernel), and
--dec-slots at each count of (row, head) pairs per warp (attention_cuda.DEC_SLOTS; the bits are the same;
"auto", the default, lets attention_cuda.decode_slots pick per batch), each with every split kernel of
--decode-split (attention_cuda.DECODE_SPLIT: "tiles", a chunk's tiles walked by the block together, or
"keys", each warp its own tiles, merged in the block). --flash-f16-keys times the prompt
kernel over a float16 cache at each tile size (attention_cuda.FLASH_F16_KEYS, compiled in; 64 runs one
block per SM, 32 two).
Decode also runs as a graph replay calls it: n_kv the whole 32k buffer, the rows' positions at the
context, so every chunk past them is a block that exits at once ("buffer_32k").

Decode (T = 1 and 4 rows at the cache's end) reports GB/s of K/V bytes read against the ~4.2 TB/s
HBM copy rate, with L2 flushed before each call (a decode step's other layers evict the cache) and
warm (back-to-back calls). Prefill (T = 512 and 2048 rows at the end of n_kv, up to 32k) reports
TFLOP/s counting 4 * D * H * sum over rows of the visible keys, for each prompt kernel: "f16" (tensor
cores, cuda/flash_attention.cu) and "f32" (the CUDA-core check path). Timing: one warm-up call discarded; a spin
kernel holds the GPU while the host enqueues every timed call, so the CUDA events around each call
measure GPU time without Python launch gaps; median, min and max of --repeat calls.

--against times another version of cuda/flash_attention.cu beside each "f16" prefill case: a git revision
(`git show REV:cuda/flash_attention.cu`) or the path of a .cu file (a copy of the tree without git
history), compiled as its own cupy.RawModule and launched by the convention its source implies (before
flash_tiled: grid (position blocks, H / HB), 32-key tiles up to head dim 128; with it: 64-key tiles over a
float16 cache). Each such row gains "against" with that version's time and TFLOP/s and the max abs
difference of the two outputs.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import cupy as cp
import numpy as np

from runner.backends.cuda import attention as attention_cuda
from runner.backends.cuda.attention import attention
from scripts.bench.common import environment, older_kernel, write_result

HBM_TB_S = 4.2
BUFFER = 32768  # the graph-replay case's cache rows
DECODE_N_KV = (128, 1024, 4096, 8192, 32768)
PREFILL = ((512, 512), (512, 2048), (512, 8192), (2048, 2048), (2048, 8192), (2048, 32768))  # (T, n_kv)
SPIN = cp.RawKernel(r"""
extern "C" __global__ void spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {}
}""", "spin")
L2_FLUSH_BYTES = 256 << 20  # well past the H200's 50 MB L2


def summary_ms(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 5), "min": round(min(values), 5),
            "max": round(max(values), 5), "n": len(values)}


def time_calls_ms(fn, repeat: int, flush: cp.ndarray | None) -> list[float]:
    fn()  # warm-up (and the first compile), discarded
    cp.cuda.get_current_stream().synchronize()
    starts, stops = [cp.cuda.Event() for _ in range(repeat)], [cp.cuda.Event() for _ in range(repeat)]
    SPIN((1,), (1,), (np.int64(100_000_000),))  # ~50 ms at ~2 GHz: the host enqueues everything meanwhile
    for start, stop in zip(starts, stops):
        if flush is not None:
            flush.fill(0)
        start.record()
        fn()
        stop.record()
    stops[-1].synchronize()
    return [cp.cuda.get_elapsed_time(a, b) for a, b in zip(starts, stops)]


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    head_dim: int


SHAPES = {"air": Shape(96, 8, 128), "seed": Shape(16, 4, 128)}


def inputs(sh: Shape, n_rows: int, n_kv: int, kv_dtype, rows_in_cache: int | None = None) -> tuple[cp.ndarray, ...]:
    """q for n_rows at the end of an n_kv context, in a cache of rows_in_cache rows (default n_kv)."""
    q = cp.random.standard_normal((n_rows, sh.heads, sh.head_dim), dtype=cp.float32)
    shape = (rows_in_cache or n_kv, sh.kv_heads, sh.head_dim)
    k = cp.random.standard_normal(shape, dtype=cp.float32).astype(kv_dtype)
    v = cp.random.standard_normal(shape, dtype=cp.float32).astype(kv_dtype)
    positions = cp.arange(n_kv - n_rows, n_kv, dtype=cp.int32)
    return q, k, v, positions


def bench_decode(sh: Shape, repeat: int, flush: cp.ndarray, kv_chunk: int) -> list[dict]:
    rows = []
    for kv_dtype in (cp.float32, cp.float16):
        for n_rows in (1, 4, 8):
            for n_kv in DECODE_N_KV:
                for buffer in (None, BUFFER) if n_kv < BUFFER else (None,):
                    q, k, v, positions = inputs(sh, n_rows, n_kv, kv_dtype, buffer)
                    out = cp.empty((n_rows, sh.heads * sh.head_dim), dtype=cp.float32)
                    call = lambda: attention(q, k, v, k.shape[0], positions, out, check_positions=False)  # noqa: E731
                    kv_bytes = 2 * n_kv * sh.kv_heads * sh.head_dim * np.dtype(kv_dtype).itemsize
                    row = {"kv_dtype": np.dtype(kv_dtype).name, "T": n_rows, "n_kv": n_kv, "kv_bytes": kv_bytes,
                           "kv_chunk": kv_chunk, "cache_rows": int(k.shape[0]),
                           "dec_slots": attention_cuda.decode_slots(n_rows * sh.heads // sh.kv_heads)}
                    for label, flush_buf in (("l2_flushed", flush), ("l2_warm", None)):
                        ms = summary_ms(time_calls_ms(call, repeat, flush_buf))
                        gbps = kv_bytes / (ms["median"] * 1e-3) / 1e9
                        row[label] = {"ms": ms, "GBps": round(gbps, 1), "of_hbm": round(gbps / (HBM_TB_S * 1e3), 3)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


@dataclass(frozen=True)
class FlashVersion:
    """Another cuda/flash_attention.cu, compiled apart, with the launch its source implies."""
    label: str
    module: cp.RawModule
    tiled: bool  # this tree's convention (flash_tiled); else the one before it

    @classmethod
    def load(cls, rev_or_file: str) -> FlashVersion:
        source, module = older_kernel(rev_or_file, "flash_attention", "FLASH_F16_KEYS=64")
        return cls(rev_or_file, module, "flash_tiled" in source)

    def shared_bytes(self, head_dim: int, kv_tag: str, cap: int) -> int:
        if self.tiled:
            return attention_cuda._flash_shared_bytes(head_dim, kv_tag, cap, f16_keys=64)
        return (attention_cuda.FLASH_ROWS + 2 * {64: 32, 128: 32, 256: 16}[cap]) * (head_dim + 8) * 2

    def caller(self, q, k, v, n_kv: int, positions, out):
        """A no-argument launch of this version's prompt kernel on these arrays."""
        n_rows, n_head, head_dim = q.shape
        n_head_kv = k.shape[1]
        cap = attention_cuda._head_dim_cap(head_dim)
        kv_tag = attention_cuda.KV_DTYPES[k.dtype]
        kernel = self.module.get_function(f"flash_prefill_{kv_tag}_d{cap}")
        kernel.max_dynamic_shared_size_bytes = self.shared_bytes(cap, kv_tag, cap)
        hb = attention_cuda._heads_per_block(n_head // n_head_kv)
        blocks = -(-n_rows // (attention_cuda.FLASH_ROWS // hb))
        grid = (n_head // hb, blocks) if self.tiled else (blocks, n_head // hb)
        args = (q, k, v, positions, out, np.int32(n_rows), np.int32(n_head), np.int32(n_head_kv), np.int32(head_dim),
                np.int32(n_kv), np.int32(hb), np.float32(1.0 / np.sqrt(head_dim)))
        shared = self.shared_bytes(head_dim, kv_tag, cap)
        return lambda: kernel(grid, (attention_cuda.FLASH_THREADS,), args, shared_mem=shared)


PROMPT_KERNELS = (("f16", cp.float32), ("f16", cp.float16), ("f32", cp.float32))  # (precision, cache dtype)


def bench_prefill(sh: Shape, repeat: int, against: FlashVersion | None = None,
                  kernels: tuple = PROMPT_KERNELS) -> list[dict]:
    rows = []
    for precision, kv_dtype in kernels:
        for n_rows, n_kv in PREFILL:
            q, k, v, positions = inputs(sh, n_rows, n_kv, kv_dtype)
            out = cp.empty((n_rows, sh.heads * sh.head_dim), dtype=cp.float32)
            call = lambda: attention(q, k, v, n_kv, positions, out, check_positions=False,  # noqa: E731
                                     precision=precision)
            visible_keys = sum(range(n_kv - n_rows + 1, n_kv + 1))
            flops = 4 * sh.head_dim * sh.heads * visible_keys
            ms = summary_ms(time_calls_ms(call, repeat, None))
            row = {"precision": precision, "kv_dtype": np.dtype(kv_dtype).name, "T": n_rows, "n_kv": n_kv,
                   "flops": flops, "ms": ms, "TFLOPs": round(flops / (ms["median"] * 1e-3) / 1e12, 2)}
            if precision == "f16" and kv_dtype == cp.float16:
                row["flash_f16_keys"] = attention_cuda.FLASH_F16_KEYS
            if against is not None and precision == "f16":
                other = cp.empty_like(out)
                other_ms = summary_ms(time_calls_ms(against.caller(q, k, v, n_kv, positions, other), repeat, None))
                row["against"] = {"version": against.label, "ms": other_ms,
                                  "TFLOPs": round(flops / (other_ms["median"] * 1e-3) / 1e12, 2),
                                  "max_abs_diff": float(cp.abs(out - other).max())}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30, help="timed calls per case (>= 20)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here")
    parser.add_argument("--commit", default=None, help="the commit measured (default: the checkout's)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="air", help="attention heads, kv heads, head dim")
    parser.add_argument("--kv-chunks", default=str(attention_cuda.KV_CHUNK), help="decode split sizes to time")
    parser.add_argument("--dec-slots", default="auto", help="decode pairs per warp to time: 1, 2, 4 or auto")
    parser.add_argument("--decode-split", default=attention_cuda.DECODE_SPLIT,
                        help="decode split kernels to time: tiles, keys (attention_cuda.DECODE_SPLIT)")
    parser.add_argument("--flash-f16-keys", default=str(attention_cuda.FLASH_F16_KEYS),
                        help="prompt kernel tile sizes to time over a float16 cache: 64, 32")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--decode-only", action="store_true")
    only.add_argument("--prefill-only", action="store_true")
    parser.add_argument("--against", default=None, metavar="REV_OR_FILE",
                        help="also time this version of cuda/flash_attention.cu (git revision or .cu path)")
    args = parser.parse_args()
    sh = SHAPES[args.shape]
    flush = cp.empty(L2_FLUSH_BYTES // 4, dtype=cp.float32)
    result = {
        "environment": environment(args.commit, vars(args)),
        "shape": {"name": args.shape, "H": sh.heads, "Hkv": sh.kv_heads, "D": sh.head_dim},
        "hbm_TB_s": HBM_TB_S, "repeat": args.repeat, "decode": [],
    }
    sweep = [] if args.prefill_only else [(split, int(c), None if w == "auto" else int(w))
                                          for split in args.decode_split.split(",")
                                          for c in args.kv_chunks.split(",") for w in args.dec_slots.split(",")]
    for split, chunk, slots in sweep:  # the kernels compile per split size and slot count; prefill uses neither
        assert split in ("tiles", "keys"), f"--decode-split takes tiles or keys, got {split}"
        attention_cuda.DECODE_SPLIT, attention_cuda.KV_CHUNK, attention_cuda.DEC_SLOTS = split, chunk, slots
        result["decode"] += [{"split": split, **row} for row in bench_decode(sh, args.repeat, flush, chunk)]
    if not args.decode_only:
        against = FlashVersion.load(args.against) if args.against else None
        result["prefill"] = []
        for i, keys in enumerate(int(k) for k in args.flash_f16_keys.split(",")):
            assert keys in (32, 64), f"--flash-f16-keys takes 32 or 64, got {keys}"
            attention_cuda.FLASH_F16_KEYS = keys  # the later sizes time only the kernel they change
            kernels = PROMPT_KERNELS if i == 0 else (("f16", cp.float16),)
            result["prefill"] += bench_prefill(sh, args.repeat, against, kernels)
    write_result(result, args.out)


if __name__ == "__main__":
    main()
