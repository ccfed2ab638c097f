"""CUDA twin of NumpyOps.attention over a preallocated KV cache (cuda/attention.cu).

Decode and speculative verify (T <= SMALL_BATCH_ROWS) use split-KV flash decoding with fixed chunks
of KV_CHUNK keys, so each row's output bits do not depend on the other rows of the batch nor on
n_kv. Longer prompts use the tensor-core flash kernel (cuda/flash_attention.cu: fp16 operands,
float32 accumulation), or with precision="f32" the float32 CUDA-core tiled kernel, the check path.
"""

from __future__ import annotations

from functools import lru_cache

import cupy as cp
import numpy as np

from runner.backends.cuda.kernels import load_module
from runner.backends.cuda.launch import Kernel
from runner.backends.limits import DECODE_KV_CHUNK, SMALL_BATCH_ROWS

KV_CHUNK = DECODE_KV_CHUNK  # keys per decode split, compiled into attention.cu as -DKV_CHUNK (benchmarks sweep it)
# (row, head) pairs per decode warp, compiled in as -DDEC_SLOTS: None picks per call (decode_slots), an int
# forces it (benchmarks, tests). Output bits do not depend on it, so the choice may follow the batch.
DEC_SLOTS: int | None = None
DEC_TILE, DEC_WARPS, COMBINE_WARPS = 32, 4, 8  # match attention.cu
# Which split kernel decode runs: "keys" (every warp holds the block's pairs and walks its own tiles of the
# chunk; the warps merge in a fixed order) or "tiles" (a block's warps hold different pairs and walk a chunk's
# tiles together). Either keeps a row's bits independent of the batch; the two differ in rounding. keys on an
# H100 at the seed shape (docs/perf/2026-12-07d-seed48-decode-keys-overlap-h100.md): one row 24 against 33 us
# at 1k keys, 75 against 111 at 32k; resident seed48 5.45 -> 4.99 ms of GPU a token.
DECODE_SPLIT = "keys"
# The keys split's loads in flight a lane, compiled in as -DDEC_K_AHEAD and -DDEC_V_AHEAD: 4-value loads of its key's
# row at once (16: 64 dims), and keys whose V values load before the first of them is accumulated (8). Bits do not
# depend on them. 07i's ncu put the keys split at 18.4 us a layer of resident seed48 at 1k keys (2.4 MB of K/V); its
# PTX waited out a load a key in V (32 a tile) and loaded a key's row 4 loads at a time. 1 and 1 keeps that schedule:
# 16 and 8 stay off until a GPU has run them (docs/wip/gpu-call-46.sh).
DEC_K_AHEAD, DEC_V_AHEAD = 1, 1
PF_BQ, PF_BK, PF_THREADS = 64, 64, 256  # match attention.cu
# Keys per tile (BK) of the prompt kernel (flash_attention.cu) over a float16 cache up to head dim 128,
# compiled in as -DFLASH_F16_KEYS: 64 (one block of 8 warps per SM) or 32 (two; benchmarks sweep it).
# Output bits depend on it, so it is fixed per process, never picked per call.
FLASH_F16_KEYS = 64
FLASH_F32_KEYS, FLASH_STAGED_KEYS = 32, 16  # the float32 cache's up to head dim 128; head dim 256's
FLASH_TILED_CAP = 128  # caps up to it run flash_tiled (two K/V stages), 256 flash_staged (q beside one tile)
FLASH_ROWS, FLASH_THREADS = 128, 256  # query rows (heads x positions) and threads per block
HEAD_DIM_CAPS = (64, 128, 256)  # register footprints compiled in attention.cu
MAX_GRID_Y = 65535  # chunks are the decode grid's y dimension
KV_DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}


def decode_slots(pairs_per_kv_head: int) -> int:
    """Pairs per warp: the fewest that fit a KV head's pairs in one block, so every warp computes.

    Measured on the H200 (docs/perf/2026-12-04b-decode-plain-vs-mtp-h200.md): with few pairs (one row,
    4 query heads per KV head) one pair per warp is 2.1x faster at 8k keys than 4 per warp, which left
    three warps idle; with many (verify rows, 12 heads per KV head) 4 per warp share each K/V tile
    and win."""
    if DEC_SLOTS is not None:
        return DEC_SLOTS
    if DECODE_SPLIT == "keys":  # a block's pairs are one warp's slots
        return next((s for s in (1, 2) if pairs_per_kv_head <= s), 4)
    return next((s for s in (1, 2) if pairs_per_kv_head <= DEC_WARPS * s), 4)


def _decode_shared_bytes(head_dim: int, slots: int) -> int:
    if DECODE_SPLIT == "keys":  # q [slots][D], the warps' o [DEC_WARPS][slots][D] and (m, l) [DEC_WARPS][slots]
        return ((slots + DEC_WARPS * slots) * head_dim + 2 * DEC_WARPS * slots) * 4
    return (DEC_TILE * (head_dim + 4) + DEC_TILE * head_dim + DEC_WARPS * slots * head_dim) * 4


def _prefill_shared_bytes(head_dim: int) -> int:
    return (2 * head_dim * PF_BQ + PF_BK * PF_BQ) * 4


def _flash_shared_bytes(head_dim: int, kv_tag: str, cap: int, f16_keys: int | None = None) -> int:
    """flash_tiled: 2 stages of a K and a V tile [BK][cap + 8] fp16; flash_staged: q [128][D + 8] beside one."""
    if cap > FLASH_TILED_CAP:
        return (FLASH_ROWS + 2 * FLASH_STAGED_KEYS) * (head_dim + 8) * 2
    keys = (f16_keys or FLASH_F16_KEYS) if kv_tag == "f16" else FLASH_F32_KEYS
    return 2 * 2 * keys * (cap + 8) * 2


def _heads_per_block(group: int) -> int:
    """Query heads sharing a KV head that one block serves together (each K/V tile feeds all of them)."""
    return next(hb for hb in (8, 4, 2, 1) if group % hb == 0)


def _kernel(name: str, max_shared_bytes: int = 0, module: str = "attention", slots: int = 4) -> Kernel:
    if module == "attention":
        return _compiled(module, name, max_shared_bytes, (f"KV_CHUNK={KV_CHUNK}", f"DEC_SLOTS={slots}",
                                                          f"DEC_K_AHEAD={DEC_K_AHEAD}", f"DEC_V_AHEAD={DEC_V_AHEAD}"))
    return _compiled(module, name, max_shared_bytes, (f"FLASH_F16_KEYS={FLASH_F16_KEYS}",))


@lru_cache(maxsize=None)
def _compiled(module: str, name: str, max_shared_bytes: int, defines: tuple[str, ...]) -> Kernel:
    """The kernel with its dynamic shared-memory ceiling raised once, to what its largest head dim needs.

    The ceiling is an attribute of the CUDA function itself, so it must not depend on the call's D:
    a smaller later setting would make launches with a larger D fail."""
    kernel = load_module(module, defines).get_function(name)
    if max_shared_bytes:
        kernel.max_dynamic_shared_size_bytes = max_shared_bytes
    return kernel


def _head_dim_cap(head_dim: int) -> int:
    return next(cap for cap in HEAD_DIM_CAPS if head_dim <= cap)


def _check_positions(q_positions: cp.ndarray, n_kv: int) -> None:
    """Positions must lie in [0, n_kv): one small device-to-host copy, skipped while a graph captures."""
    if cp.cuda.get_current_stream().is_capturing():
        return
    check_positions_in_range(cp.asnumpy(q_positions), n_kv)


def check_positions_in_range(positions: np.ndarray, n_kv: int) -> None:
    """Host positions (non-empty) must lie in [0, n_kv): the cached keys they attend to."""
    assert positions.min() >= 0 and positions.max() < n_kv, (
        f"q_positions span [{positions.min()}, {positions.max()}], but only keys 0..{n_kv - 1} are cached"
    )


def attention(q: cp.ndarray, k_cache: cp.ndarray, v_cache: cp.ndarray, n_kv: int, q_positions: cp.ndarray,
              out: cp.ndarray | None = None, *, check_positions: bool = True, precision: str = "f16") -> cp.ndarray:
    """Causal GQA attention of q [T, H, D] at q_positions [T] over the first n_kv rows of k/v_cache
    [n_ctx, Hkv, D] (float32 or float16) -> float32 [T, H*D]. check_positions=False skips the
    host-side position check (a device sync) on hot paths whose positions are known to be valid.
    `precision` picks the prompt kernel (T > SMALL_BATCH_ROWS): "f16" tensor cores, "f32" CUDA cores."""
    assert precision in ("f16", "f32"), f"precision must be f16 or f32, got {precision}"
    assert isinstance(q, cp.ndarray) and q.dtype == cp.float32, f"q must be cupy float32, got {getattr(q, 'dtype', q)}"
    assert q.ndim == 3 and q.flags.c_contiguous, f"q must be C-contiguous [T, H, D], got shape {q.shape}"
    n_rows, n_head, head_dim = q.shape
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        assert isinstance(cache, cp.ndarray) and cache.dtype in KV_DTYPES, f"{name} must be cupy float32 or float16"
        assert cache.flags.c_contiguous, f"{name} must be C-contiguous"
    assert k_cache.dtype == v_cache.dtype, f"k_cache {k_cache.dtype} and v_cache {v_cache.dtype} differ in dtype"
    assert k_cache.ndim == 3 and k_cache.shape == v_cache.shape, (
        f"k_cache {k_cache.shape} and v_cache {v_cache.shape} must both be [n_ctx, Hkv, D]"
    )
    n_ctx, n_head_kv, cache_dim = k_cache.shape
    assert cache_dim == head_dim, f"cache head dim {cache_dim} differs from q's {head_dim}"
    assert head_dim % 32 == 0 and head_dim <= HEAD_DIM_CAPS[-1], (
        f"head dim {head_dim} must be a multiple of 32 up to {HEAD_DIM_CAPS[-1]}"
    )
    assert n_head_kv > 0 and n_head % n_head_kv == 0, f"H {n_head} must be a multiple of Hkv {n_head_kv}"
    assert 1 <= n_kv <= n_ctx, f"n_kv {n_kv} must be in [1, {n_ctx}]"
    assert n_kv <= MAX_GRID_Y * KV_CHUNK, f"n_kv {n_kv} exceeds the decode grid's {MAX_GRID_Y * KV_CHUNK} keys"
    assert isinstance(q_positions, cp.ndarray) and q_positions.dtype == cp.int32, "q_positions must be cupy int32"
    assert q_positions.shape == (n_rows,) and q_positions.flags.c_contiguous, (
        f"q_positions shape {q_positions.shape} must be ({n_rows},) and contiguous"
    )
    if out is None:
        out = cp.empty((n_rows, n_head * head_dim), dtype=cp.float32)
    assert isinstance(out, cp.ndarray) and out.dtype == cp.float32 and out.flags.c_contiguous, (
        "out must be C-contiguous cupy float32"
    )
    assert out.shape == (n_rows, n_head * head_dim), f"out shape {out.shape} must be ({n_rows}, {n_head * head_dim})"
    if n_rows == 0:
        return out
    if check_positions:
        _check_positions(q_positions, n_kv)

    cap = _head_dim_cap(head_dim)
    tag = f"{KV_DTYPES[k_cache.dtype]}_d{cap}"
    scale = np.float32(1.0 / np.sqrt(head_dim))  # the twin's
    dims = (np.int32(n_rows), np.int32(n_head), np.int32(n_head_kv), np.int32(head_dim), np.int32(n_kv))
    if n_rows <= SMALL_BATCH_ROWS:
        _decode(q, k_cache, v_cache, q_positions, out, tag, cap, dims, scale)
    elif precision == "f16":
        _flash(q, k_cache, v_cache, q_positions, out, tag, cap, dims, scale)
    else:
        shared = _prefill_shared_bytes(head_dim)
        _kernel(f"attn_prefill_{tag}", _prefill_shared_bytes(cap))(
            (-(-n_rows // PF_BQ), n_head), (PF_THREADS,), (q, k_cache, v_cache, q_positions, out, *dims, scale),
            shared_mem=shared,
        )
    return out


def _flash(q, k_cache, v_cache, q_positions, out, tag: str, cap: int, dims: tuple, scale: np.float32) -> None:
    """One launch: grid (query-head groups of HB, position blocks of 128 / HB), run last block first."""
    n_rows, n_head, n_head_kv, head_dim, _ = (int(d) for d in dims)
    hb = _heads_per_block(n_head // n_head_kv)
    position_blocks = -(-n_rows // (FLASH_ROWS // hb))
    assert position_blocks <= MAX_GRID_Y, f"{n_rows} rows need {position_blocks} position blocks, over {MAX_GRID_Y}"
    kv_tag = KV_DTYPES[k_cache.dtype]
    _kernel(f"flash_prefill_{tag}", _flash_shared_bytes(cap, kv_tag, cap), "flash_attention")(
        (n_head // hb, position_blocks), (FLASH_THREADS,),
        (q, k_cache, v_cache, q_positions, out, *dims, np.int32(hb), scale),
        shared_mem=_flash_shared_bytes(head_dim, kv_tag, cap),
    )


def _decode(q, k_cache, v_cache, q_positions, out, tag: str, cap: int, dims: tuple, scale: np.float32) -> None:
    """Two launches: the split over (pairs, chunks, kv heads), then the merge per (head, row, 32 dims)."""
    n_rows, n_head, n_head_kv, head_dim, n_kv = (int(d) for d in dims)
    n_chunks = -(-n_kv // KV_CHUNK)
    n_pairs = n_rows * (n_head // n_head_kv)
    part_o = cp.empty((n_rows, n_head, n_chunks, head_dim), dtype=cp.float32)
    part_ml = cp.empty((n_rows, n_head, n_chunks, 2), dtype=cp.float32)
    slots = decode_slots(n_pairs)
    shared = _decode_shared_bytes(head_dim, slots)
    keys = DECODE_SPLIT == "keys"
    pairs_per_block = slots if keys else DEC_WARPS * slots
    grid = (-(-n_pairs // pairs_per_block), n_chunks, n_head_kv)
    args = (q, k_cache, v_cache, q_positions, part_o, part_ml, *dims, np.int32(n_chunks), scale)
    _kernel(f"attn_decode_{'keys' if keys else 'split'}_{tag}", _decode_shared_bytes(cap, slots), slots=slots)(
        grid, (DEC_WARPS * 32,), args, shared_mem=shared)
    _kernel("attn_decode_combine")(
        (n_head, n_rows, head_dim // 32), (COMBINE_WARPS * 32,),
        (part_o, part_ml, q_positions, out, np.int32(n_head), np.int32(head_dim), np.int32(n_kv), np.int32(n_chunks)),
    )
