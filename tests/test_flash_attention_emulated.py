"""The prompt attention kernel's per-row online softmax (cuda/flash_attention.cu) transliterated to numpy float32,
without a GPU: a layer-major group's one launch gives every row the bits of its micro-batch's own launch.

The transliteration keeps what decides a row's bits: key tiles of BK keys from key 0 (64 or 32 over a float16
cache up to head dim 128, 32 over a float32 one, 16 at head dim 256), warps of 16 positions of one head and
blocks of 128 / HB positions (HB heads of a KV group), the block's key_end, the warp's skip (k0 > warp_last)
and masking condition (k0 + BK - 1 > warp_first), K/V past n_kv read as zeros, q, K, V and P rounded to fp16,
scores masked to -inf, the running max in the raw-score domain, flash_tiled's chosen rescale (exactly 1 when
the max stays), ex2.approx.ftz of fmaf(s, sl2, -max * sl2), per-lane partial sums (columns 2t, 2t + 1 of each
8-key block) joined by the two xor shuffles, the warp-wide `any` rescale of the accumulators, 1 / l; and
flash_staged's exp2f of (s - max) * sl2 with its unconditional rescale. An mma is modelled as exact fp16
products summed in float64 onto the float32 accumulator and rounded once: not the tensor cores' own summation,
but like it a function of the row's operands alone in which exact-zero products leave the accumulator as it
is, which is all the argument needs. The micro-batch launches see stale NaN rows past their n_kv (later
chunks not yet written); the group's launch sees those rows written.
"""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.numpy.ops import NumpyOps

F32, F64 = np.float32, np.float64
LOG2E = F32(1.4426950408889634)
ROWS, WARP_ROWS = 128, 16  # FLASH_ROWS; positions per warp


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(F32)  # round to nearest even, then exact


def _mma(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """c [16, N] float32 + a [16, 16] @ b [16, N] (fp16 values): exact products added to c in float64 in one fixed
    order (the same for every element, whatever its row's place in the warp), rounded once to float32."""
    acc = c.astype(F64)
    a64, b64 = a.astype(F64), b.astype(F64)
    for i in range(a.shape[1]):
        acc += a64[:, i : i + 1] * b64[i : i + 1, :]
    return acc.astype(F32)


def _ex2_ftz(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", under="ignore"):
        y = np.exp2(x.astype(F32))
    return np.where(np.abs(y) < np.finfo(F32).tiny, F32(0), y).astype(F32)


def _fma(a: np.ndarray, b, c) -> np.ndarray:
    """fmaf: the product is exact in float64; the sum rounds there, then to float32 (a double rounding the
    kernel has not, immaterial here: -inf * sl2 - x = -inf and l * 1 + 0 = l either way)."""
    return (a.astype(F64) * np.asarray(b, F64) + np.asarray(c, F64)).astype(F32)


def _heads_per_block(group: int) -> int:
    return next(hb for hb in (8, 4, 2, 1) if group % hb == 0)


def _warp(qf, kc, vc, g, p, key_end, n_kv, bk, dcap, d, sl2, staged, origin):
    """One warp's 16 rows (positions p, -1 past T) of one head: out [16, d] float32."""
    warp_last, warp_first = int(p.max()), int(p.min())
    m = np.full(WARP_ROWS, -np.inf, F32)
    lanes = np.zeros((4, WARP_ROWS), F32)  # l: lane t's partial sum of each row (columns 2t, 2t + 1)
    o = np.zeros((WARP_ROWS, dcap), F32)
    for k0 in range(origin, key_end, bk):
        if k0 > warp_last:
            continue
        keys = np.arange(k0, k0 + bk)
        inside = (keys >= 0) & (keys < n_kv)
        kt = np.zeros((bk, dcap), F32)
        vt = np.zeros((bk, dcap), F32)
        kt[inside, :d] = _f16(kc[keys[inside], g])
        vt[inside, :d] = _f16(vc[keys[inside], g])
        s = np.zeros((WARP_ROWS, bk), F32)
        for kk in range(0, dcap, 16):
            s = _mma(s, qf[:, kk : kk + 16], kt[:, kk : kk + 16].T)
        if staged or origin != 0 or k0 + bk - 1 > warp_first:
            s = np.where((keys[None, :] <= p[:, None]) & (keys[None, :] >= 0), s, F32(-np.inf)).astype(F32)
        mx = np.maximum(m, s.max(axis=1))
        if staged:
            mu = np.where(mx == -np.inf, F32(0), mx).astype(F32)
            with np.errstate(invalid="ignore"):
                al = np.exp2(((m - mu).astype(F32) * sl2).astype(F32)).astype(F32)
                s = np.exp2(((s - mu[:, None]).astype(F32) * sl2).astype(F32)).astype(F32)
        else:
            with np.errstate(invalid="ignore"):
                al = np.where(mx == m, F32(1), _ex2_ftz(((m - mx).astype(F32) * sl2).astype(F32))).astype(F32)
            ms = np.where(mx == -np.inf, F32(0), (mx * sl2).astype(F32)).astype(F32)
            s = _ex2_ftz(_fma(s, sl2, -ms[:, None]))
        m = mx
        rs = np.zeros((4, WARP_ROWS), F32)
        for j in range(bk // 8):
            for t in range(4):
                rs[t] = rs[t] + (s[:, 8 * j + 2 * t] + s[:, 8 * j + 2 * t + 1])
        lanes = _fma(lanes, al[None, :], rs)  # l * al + rs, contracted by nvcc
        if staged or np.any(al != 1):  # flash_tiled: __any_sync over the warp
            o = (o * al[:, None]).astype(F32)
        pf = _f16(s)
        for kk in range(0, bk, 16):
            o = _mma(o, pf[:, kk : kk + 16], vt[kk : kk + 16])
    total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])).astype(F32)  # the xor-1, then xor-2 shuffles
    with np.errstate(divide="ignore", invalid="ignore"):
        if staged:
            return (o[:, :d] / total[:, None]).astype(F32)
        return (o[:, :d] * (F32(1) / total)[:, None]).astype(F32)


def flash_emulated(q, kc, vc, n_kv: int, pos, f16_keys: int = 64, origin: int = 0) -> np.ndarray:
    """One launch of flash_prefill over q [T, H, D] at pos [T] and the first n_kv rows of kc/vc [n_ctx, Hkv, D]
    (float16 or float32) -> [T, H * D] float32. `origin` != 0 moves the first key tile (a control only)."""
    n_rows, n_head, d = q.shape
    n_head_kv = kc.shape[1]
    group = n_head // n_head_kv
    staged = d > 128
    dcap = d if staged else (64 if d <= 64 else 128)
    bk = 16 if staged else (f16_keys if kc.dtype == np.float16 else 32)
    sl2 = F32(F32(1.0 / np.sqrt(d)) * LOG2E)
    per_block = ROWS // _heads_per_block(group)
    out = np.full((n_rows, n_head, d), np.nan, F32)
    clamped = np.minimum(pos, n_kv - 1)
    for b0 in range(0, n_rows, per_block):
        key_end = int(clamped[b0 : b0 + per_block].max()) + 1
        for t0 in range(b0, min(b0 + per_block, n_rows), WARP_ROWS):
            rows = np.arange(t0, t0 + WARP_ROWS)
            valid = rows < n_rows
            p = np.where(valid, clamped[np.minimum(rows, n_rows - 1)], -1)
            for h in range(n_head):
                qf = np.zeros((WARP_ROWS, dcap), F32)
                qf[valid, :d] = _f16(q[rows[valid], h])
                got = _warp(qf, kc, vc, h // group, p, key_end, n_kv, bk, dcap, d, sl2, staged, origin)
                out[rows[valid], h] = got[valid]
    return out.reshape(n_rows, n_head * d)


def _prompt(layout, prefix: int, sizes: list[int], kv_dtype, seed: int):
    n_head, n_head_kv, d = layout
    n = prefix + sum(sizes)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, n_head, d)).astype(F32)
    k = rng.standard_normal((n, n_head_kv, d)).astype(kv_dtype)
    v = rng.standard_normal((n, n_head_kv, d)).astype(kv_dtype)
    return q, k, v


def _chunk_by_chunk(q, k, v, prefix: int, sizes: list[int], **kw) -> np.ndarray:
    """Each micro-batch over the cache so far; rows past it stale (NaN), as before its later chunks' stores."""
    pieces, a = [], prefix
    for n in sizes:
        kc, vc = np.full_like(k, np.nan), np.full_like(v, np.nan)
        kc[: a + n], vc[: a + n] = k[: a + n], v[: a + n]
        pieces.append(flash_emulated(q[a : a + n], kc, vc, a + n, np.arange(a, a + n), **kw))
        a += n
    return np.concatenate(pieces)


def _grouped(q, k, v, prefix: int, **kw) -> np.ndarray:
    n = len(k)
    return flash_emulated(q[prefix:], k, v, n, np.arange(prefix, n), **kw)


CASES = [  # (H, Hkv, D), cached prefix, micro-batch sizes (the last one shorter), f16 key tile
    ((4, 2, 64), 0, [40, 40, 40, 40, 20], 64),  # tiny synth models' layout: HB 2, 64-row blocks
    ((4, 2, 64), 37, [40, 40, 13], 64),  # a second prompt after a cached prefix
    ((8, 8, 64), 5, [33, 70, 9], 32),  # HB 1 (128-row blocks), the 32-key build
    ((8, 1, 96), 61, [17, 50], 64),  # HB 8 (16-row blocks), D below its cap of 128
    ((16, 4, 128), 100, [45, 64, 30], 64),  # HB 4
    ((6, 3, 256), 19, [30, 41, 12], 64),  # flash_staged, 16-key tiles
    ((4, 2, 64), 63, [9, 9, 9], 64),  # the smallest grouped micro-batches, from the last key of a tile
    ((2, 1, 32), 64, [9, 130, 11], 32),  # D 32 at cap 64, a micro-batch over a whole 128-row block
]


@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
@pytest.mark.parametrize(("layout", "prefix", "sizes", "f16_keys"), CASES)
def test_a_groups_launch_gives_each_row_its_micro_batchs_bits(layout, prefix, sizes, f16_keys, kv_dtype) -> None:
    q, k, v = _prompt(layout, prefix, sizes, kv_dtype, seed=prefix + len(sizes))
    alone = _chunk_by_chunk(q, k, v, prefix, sizes, f16_keys=f16_keys)
    grouped = _grouped(q, k, v, prefix, f16_keys=f16_keys)
    assert np.isfinite(grouped).all()
    assert np.array_equal(alone.view(np.uint32), grouped.view(np.uint32))
    # and it is attention: the numpy twin over the same fp16-rounded operands, within the GPU tests' ATOL
    want = NumpyOps().attention(_f16(q[prefix:]).astype(F64), _f16(k).astype(F64), _f16(v).astype(F64),
                                np.arange(prefix, len(k)))
    np.testing.assert_allclose(grouped, want, rtol=0, atol=2e-3)


def test_the_check_sees_tile_boundaries_that_follow_n_kv() -> None:
    """Control: key tiles placed from n_kv's end (as a split over n_kv would) change some row's bits."""
    layout, prefix, sizes = (4, 2, 64), 37, [40, 40, 13]
    q, k, v = _prompt(layout, prefix, sizes, np.float16, seed=1)
    pieces, a = [], prefix
    for n in sizes:
        kc, vc = np.full_like(k, np.nan), np.full_like(v, np.nan)
        kc[: a + n], vc[: a + n] = k[: a + n], v[: a + n]
        pieces.append(flash_emulated(q[a : a + n], kc, vc, a + n, np.arange(a, a + n), origin=(a + n) % 64 - 64))
        a += n
    grouped = flash_emulated(q[prefix:], k, v, len(k), np.arange(prefix, len(k)), origin=len(k) % 64 - 64)
    assert np.allclose(np.concatenate(pieces), grouped, rtol=0, atol=2e-3)
    assert not np.array_equal(np.concatenate(pieces), grouped)
