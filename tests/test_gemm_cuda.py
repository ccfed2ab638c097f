"""The prompt path's dense GEMM (linear_rows in cuda/moe_prefill.cu) against float64 numpy and cuBLAS.

Operands are rounded to fp16 and products accumulate in float32: |out - ref| <= 2e-3 (|x| @ |W|^T)
+ 1e-6 per element. Row invariance is bit for bit: any split of the rows gives the same output.
"""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda.gemm import COL_TILE, ROW_TILE, SMALL_ROW_TILE, matmul_rows, matmul_t  # noqa: E402
from runner.backends.cuda.moe_prefill import MP_THREADS, tile_kernel, tile_shared_bytes  # noqa: E402


@pytest.mark.parametrize("t,n,k", [(9, 64, 32), (100, 100, 96), (2048, 2048, 2048), (333, 151, 512), (64, 1, 64)])
def test_matches_float64_and_cublas(t: int, n: int, k: int) -> None:
    rng = np.random.default_rng(t + n + k)
    x = rng.standard_normal((t, k)).astype(np.float32)
    w = (0.05 * rng.standard_normal((n, k))).astype(np.float16)
    got = cp.asnumpy(matmul_rows(cp.asarray(x), cp.asarray(w)))
    x16 = x.astype(np.float16).astype(np.float64)
    want = x16 @ w.astype(np.float64).T
    bound = 2e-3 * (np.abs(x16) @ np.abs(w.astype(np.float64)).T) + 1e-6
    assert np.all(np.abs(got - want) <= bound)
    cublas = cp.asnumpy(matmul_t(cp.asarray(x.astype(np.float16)), cp.asarray(w)))
    assert np.all(np.abs(got - cublas) <= 2 * bound)


def test_rows_do_not_depend_on_the_batch() -> None:
    rng = np.random.default_rng(3)
    x = cp.asarray(rng.standard_normal((700, 256)).astype(np.float32))
    w = cp.asarray((0.05 * rng.standard_normal((320, 256))).astype(np.float16))
    whole = matmul_rows(x, w)
    for a, b in ((0, 1), (1, 65), (65, 300), (300, 700)):
        cp.testing.assert_array_equal(matmul_rows(x[a:b], w), whole[a:b])


def test_bad_shapes_are_refused() -> None:
    x = cp.ones((4, 48), dtype=cp.float32)
    with pytest.raises(AssertionError, match="multiple of 32"):
        matmul_rows(x, cp.ones((8, 48), dtype=cp.float16))
    with pytest.raises(AssertionError, match="float32"):
        matmul_rows(x.astype(cp.float16), cp.ones((8, 48), dtype=cp.float16))


@pytest.mark.parametrize("t,n,k", [(1, 7, 32), (130, 129, 64), (65, 300, 160), (129, 257, 2080), (300, 1000, 96)])
def test_tile_edges_match_float64(t: int, n: int, k: int) -> None:
    """Partial row and column tiles, odd N, one K step (K = 32) and K steps not a multiple of the stages."""
    rng = np.random.default_rng(t * n + k)
    x = rng.standard_normal((t, k)).astype(np.float32)
    w = (0.05 * rng.standard_normal((n, k))).astype(np.float16)
    got = cp.asnumpy(matmul_rows(cp.asarray(x), cp.asarray(w)))
    x16 = x.astype(np.float16).astype(np.float64)
    want = x16 @ w.astype(np.float64).T
    assert np.all(np.abs(got - want) <= 2e-3 * (np.abs(x16) @ np.abs(w.astype(np.float64)).T) + 1e-6)


@pytest.mark.parametrize("t,n", [(2048, 512), (333, 151)])
def test_both_row_tiles_give_the_same_bits(t: int, n: int) -> None:
    rng = np.random.default_rng(5)
    x = cp.asarray(rng.standard_normal((t, 256)).astype(np.float32))
    w = cp.asarray((0.05 * rng.standard_normal((n, 256))).astype(np.float16))
    outs = []
    for rows, name in ((ROW_TILE, "linear_rows"), (SMALL_ROW_TILE, "linear_rows_64")):
        out = cp.empty((t, n), dtype=cp.float32)
        shared = tile_shared_bytes(rows, COL_TILE)
        tile_kernel(name, shared)((-(-t // rows) * -(-n // COL_TILE),), (MP_THREADS,),
                                  (x, w, np.int32(t), np.int32(n), np.int32(256), out), shared_mem=shared)
        outs.append(out)
    cp.testing.assert_array_equal(outs[0], outs[1])
