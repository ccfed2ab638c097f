"""The tensor-core prompt attention kernel (cuda/flash_attention.cu) against NumpyOps.attention in float64.

The kernel rounds q, K and V to fp16 once and the softmax weights P to fp16 before P V; everything
else accumulates in float32. The twin is fed the same fp16-rounded q, K and V, so what remains is
P's rounding (relative 2^-11 per weight) and float32 accumulation: with standard normal inputs the
outputs (up to ~4 in magnitude) land within about 5e-4; ATOL 2e-3 keeps a margin while a wrong mask,
a dropped key tile or a mixed-up fragment is off by 1e-2 or more. Rows of the cache past n_kv hold
NaN, so any read of them (or a zero weight times one) shows. Every case runs over a float16 cache (the
default, --cache-type f16), which the kernel copies into its tiles as it is (64 keys a tile up to head dim
128), and over a float32 one (32 keys a tile); head dim 256 takes 16 keys a tile either way.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available
from runner.backends.numpy.ops import NumpyOps

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda import attention as attention_cuda  # noqa: E402

ATOL = 2e-3


def _rounded(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float64)


def _check(n_rows: int, layout: tuple[int, int, int], n_kv: int, positions: np.ndarray, seed: int,
           kv_dtype=np.float32, integer: bool = False) -> np.ndarray:
    n_head, n_head_kv, head_dim = layout
    rng = np.random.default_rng(seed)
    if integer:  # exact scores thousands apart: a softmax without the running max would overflow
        q = rng.integers(-30, 31, size=(n_rows, n_head, head_dim)).astype(np.float32)
        k = rng.integers(-30, 31, size=(n_kv, n_head_kv, head_dim)).astype(kv_dtype)
    else:
        q = rng.standard_normal((n_rows, n_head, head_dim)).astype(np.float32)
        k = rng.standard_normal((n_kv, n_head_kv, head_dim)).astype(kv_dtype)
    v = rng.standard_normal((n_kv, n_head_kv, head_dim)).astype(kv_dtype)
    n_ctx = n_kv + 5
    k_dev = cp.full((n_ctx, n_head_kv, head_dim), cp.nan, dtype=kv_dtype)
    v_dev = cp.full((n_ctx, n_head_kv, head_dim), cp.nan, dtype=kv_dtype)
    k_dev[:n_kv], v_dev[:n_kv] = cp.asarray(k), cp.asarray(v)
    want = NumpyOps().attention(_rounded(q), _rounded(k), _rounded(v), positions)
    got = attention_cuda.attention(cp.asarray(q), k_dev, v_dev, n_kv, cp.asarray(positions), precision="f16")
    assert got.dtype == cp.float32 and got.shape == (n_rows, n_head * head_dim)
    got = cp.asnumpy(got)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    return got


def _positions(n_rows: int, n_kv: int, where: str) -> np.ndarray:
    start = n_kv - n_rows if where == "end" else n_kv // 3
    return np.clip(np.arange(start, start + n_rows), 0, n_kv - 1).astype(np.int32)


CASES = [  # (T, n_kv, (H, Hkv, D)): T == n_kv a whole prompt, larger n_kv a later micro-batch
    (9, 9, (4, 4, 64)), (9, 4096, (8, 2, 128)), (64, 64, (16, 4, 64)), (64, 1000, (4, 4, 64)),
    (127, 127, (16, 4, 128)), (129, 2049, (16, 4, 128)), (130, 130, (8, 2, 128)), (512, 4096, (16, 4, 64)),
    (2048, 2048, (16, 4, 128)), (2048, 8192, (8, 1, 128)), (300, 300, (6, 2, 256)), (200, 777, (6, 3, 256)),
    # heads per block HB = 8, 1, 2, 8 and 1; rows and keys off the 128-row blocks and 64-key tiles
    (64, 64, (16, 2, 128)), (100, 129, (8, 8, 128)), (77, 193, (4, 2, 64)), (300, 1000, (32, 4, 64)),
    (45, 127, (12, 4, 256)),
]


KV_DTYPES = [np.float16, np.float32]


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("where", ["end", "mid"])
@pytest.mark.parametrize(("n_rows", "n_kv", "layout"), CASES)
def test_prefill_matches_twin(n_rows: int, n_kv: int, layout: tuple[int, int, int], where: str, kv_dtype) -> None:
    _check(n_rows, layout, n_kv, _positions(n_rows, n_kv, where), seed=n_rows * 31 + n_kv, kv_dtype=kv_dtype)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("head_dim", [32, 96, 160, 192])
def test_head_dims_below_their_cap(head_dim: int, kv_dtype) -> None:
    """D is a runtime multiple of 32: the kernel for the next cap must stop at D, not read the padding."""
    _check(100, (6, 2, head_dim), 600, _positions(100, 600, "mid"), seed=head_dim, kv_dtype=kv_dtype)


@pytest.mark.parametrize(("n_rows", "n_kv", "layout"), [(150, 300, (16, 4, 128)), (150, 2000, (16, 4, 128)),
                                                         (9, 33, (4, 4, 64)), (97, 4099, (8, 1, 128)),
                                                         (33, 47, (6, 3, 256)), (257, 1025, (12, 2, 256))])
def test_float16_cache_at_lengths_off_the_tiles(n_rows: int, n_kv: int, layout: tuple[int, int, int]) -> None:
    """Positions and keys that end partway into a 128-row block and a key tile (64, 32 or 16 keys)."""
    _check(n_rows, layout, n_kv, _positions(n_rows, n_kv, "end"), seed=n_kv, kv_dtype=np.float16)


@pytest.mark.parametrize(("n_rows", "n_kv", "layout"), [(129, 2049, (16, 4, 128)), (77, 193, (4, 2, 64)),
                                                         (100, 129, (8, 8, 128)), (60, 500, (8, 1, 96))])
def test_float16_cache_with_32_key_tiles(n_rows: int, n_kv: int, layout: tuple[int, int, int], monkeypatch) -> None:
    """The two-blocks-per-SM build (FLASH_F16_KEYS = 32) that benchmarks weigh against the default."""
    monkeypatch.setattr(attention_cuda, "FLASH_F16_KEYS", 32)
    _check(n_rows, layout, n_kv, _positions(n_rows, n_kv, "end"), seed=n_kv, kv_dtype=np.float16)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_rows_in_any_order(kv_dtype) -> None:
    rng = np.random.default_rng(5)
    positions = rng.choice(1000, size=200, replace=False).astype(np.int32)
    _check(200, (8, 2, 128), 1000, positions, seed=6, kv_dtype=kv_dtype)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("layout", [(8, 2, 64), (16, 4, 128), (4, 4, 128), (6, 2, 256)])
def test_positions_on_key_tile_edges(layout: tuple[int, int, int], kv_dtype) -> None:
    """Rows whose last visible key ends a tile (of 16, 32 or 64 keys) or is the first of the next one,
    shuffled so that one warp mixes them with rows far ahead."""
    edges = {p for tile in (16, 32, 64, 128) for m in (1, 2, 3) for p in (m * tile - 1, m * tile)}
    positions = np.array(sorted(edges | {0, 1, 2, 385, 386}), dtype=np.int32)
    positions = np.random.default_rng(7).permutation(positions)
    _check(len(positions), layout, 387, positions, seed=8, kv_dtype=kv_dtype)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("layout", [(16, 4, 128), (8, 8, 64), (8, 1, 96), (6, 3, 256)])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(layout: tuple[int, int, int], kv_dtype) -> None:
    """A prompt run micro-batch by micro-batch (each over the cache so far, later rows of the cache
    already written) gives the bits of one call over all its rows, and so do the rows in another order."""
    n_head, n_head_kv, head_dim = layout
    n_kv = 700
    rng = np.random.default_rng(9)
    q = cp.asarray(rng.standard_normal((n_kv, n_head, head_dim)).astype(np.float32))
    k = cp.full((n_kv + 5, n_head_kv, head_dim), cp.nan, dtype=kv_dtype)
    v = cp.full((n_kv + 5, n_head_kv, head_dim), cp.nan, dtype=kv_dtype)
    k[:n_kv] = cp.asarray(rng.standard_normal((n_kv, n_head_kv, head_dim)).astype(kv_dtype))
    v[:n_kv] = cp.asarray(rng.standard_normal((n_kv, n_head_kv, head_dim)).astype(kv_dtype))
    positions = cp.arange(n_kv, dtype=cp.int32)
    whole = attention_cuda.attention(q, k, v, n_kv, positions, precision="f16")
    bounds = (0, 100, 229, 450, 451 + 64, n_kv)
    pieces = [attention_cuda.attention(q[a:b], k, v, b, positions[a:b], precision="f16")
              for a, b in itertools.pairwise(bounds)]
    cp.testing.assert_array_equal(cp.concatenate(pieces), whole)
    order = cp.asarray(rng.permutation(n_kv))
    shuffled = attention_cuda.attention(cp.ascontiguousarray(q[order]), k, v, n_kv, positions[order], precision="f16")
    cp.testing.assert_array_equal(shuffled, whole[order])


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_large_scores_are_stable(kv_dtype) -> None:
    n_kv = 700
    _check(100, (8, 2, 64), n_kv, _positions(100, n_kv, "mid"), seed=3, kv_dtype=kv_dtype, integer=True)


def test_close_to_the_float32_kernel_and_deterministic() -> None:
    """Same inputs twice give the same bits; the fp16 kernel stays near the float32 check path."""
    rng = np.random.default_rng(11)
    q = cp.asarray(rng.standard_normal((1000, 16, 128)).astype(np.float32))
    k = cp.asarray(rng.standard_normal((3000, 4, 128)).astype(np.float32))
    v = cp.asarray(rng.standard_normal((3000, 4, 128)).astype(np.float32))
    pos = cp.asarray(np.arange(2000, 3000, dtype=np.int32))
    fast = attention_cuda.attention(q, k, v, 3000, pos, precision="f16")
    cp.testing.assert_array_equal(fast, attention_cuda.attention(q, k, v, 3000, pos, precision="f16"))
    exact = attention_cuda.attention(q, k, v, 3000, pos, precision="f32")
    assert float(cp.abs(fast - exact).max()) < ATOL


def test_unknown_precision_is_refused() -> None:
    q = cp.ones((20, 4, 64), dtype=cp.float32)
    k = cp.ones((30, 2, 64), dtype=cp.float32)
    with pytest.raises(AssertionError, match="precision must be f16 or f32"):
        attention_cuda.attention(q, k, k, 30, cp.arange(20, dtype=cp.int32), precision="bf16")
