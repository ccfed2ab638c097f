"""The norm / rope / swiglu / add kernels (cuda/norm_rope.cu) against their NumpyOps twins.

Tolerances, and why they are not zero:
- rms_norm, rtol 1e-6: the row's scale is cast to float32 from a float64 mean of squares whose
  summation order differs from numpy's pairwise sum, so it can land one float32 ulp (<= 1.2e-7
  relative) away; the two float32 multiplies are then the twin's, unfused.
- rope_neox, atol 1e-5 with |x| ~ 1: cos and sin come from double pow/sincos on both sides, whose
  last-bit differences (~1e-11 absolute at theta ~ 1e5) flip the float32 rounding of a cos or sin
  now and then (6e-8 each); the rotation arithmetic is unfused float32 like numpy's.
- swiglu, rtol 1e-6 (atol 1e-37 for subnormal products): CUDA's expf and numpy's float32 exp are
  each a few ulp from exact; the add, divide and multiply round alike.
- add: bit-exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from runner.backends.cuda.kernels import gpu_available
from runner.backends.numpy.ops import NumpyOps
from runner.gguf_file import TensorInfo

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda import norm_rope as norm_rope_cuda  # noqa: E402


def _weight(w: np.ndarray) -> TensorInfo:
    return TensorInfo(name="w", qtype=GGMLQuantizationType.F32, shape=w.shape, data=w, offset=0)


def _rows_of_mixed_scale(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Normal values, each row scaled by 10^[-3, 3] so the norm sees small and large activations."""
    scale = 10.0 ** rng.uniform(-3, 3, size=shape[:-1] + (1,))
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("rows", [1, 7, 8])
@pytest.mark.parametrize("n", [1, 255, 256, 2048, 4096, 4097, 5121])
def test_rms_norm_matches_numpy_twin(rows: int, n: int) -> None:
    rng = np.random.default_rng(rows * 10007 + n)
    x = _rows_of_mixed_scale(rng, (rows, n))
    w = rng.standard_normal(n).astype(np.float32)
    for eps in (1e-6, 1e-5):
        want = NumpyOps().rms_norm(x, _weight(w), eps)
        got = norm_rope_cuda.rms_norm(cp.asarray(x), cp.asarray(w), eps)
        assert got.dtype == cp.float32 and got.shape == x.shape
        np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-6, atol=0)


def test_rms_norm_per_head_on_three_dims() -> None:
    rng = np.random.default_rng(3)
    x = _rows_of_mixed_scale(rng, (5, 12, 128))  # [tokens, heads, head_dim]: q/k norm
    w = rng.standard_normal(128).astype(np.float32)
    want = NumpyOps().rms_norm(x, _weight(w), 1e-6)
    got = norm_rope_cuda.rms_norm(cp.asarray(x), cp.asarray(w), 1e-6)
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-6, atol=0)


def test_rms_norm_of_zero_row_is_zero() -> None:
    x = cp.zeros((2, 4097), dtype=cp.float32)
    got = norm_rope_cuda.rms_norm(x, cp.ones(4097, dtype=cp.float32), 1e-6)
    assert not cp.any(got)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("tokens", [1, 2, 17, 33])
@pytest.mark.parametrize("base", [10000.0, 1000000.0])
def test_rope_neox_matches_numpy_twin(head_dim: int, partial: bool, tokens: int, base: float) -> None:
    n_rot = head_dim // 2 if partial else head_dim  # partial rotary as GLM uses
    heads = 6
    rng = np.random.default_rng(head_dim * 131 + tokens * 7 + partial)
    x = rng.standard_normal((tokens, heads, head_dim)).astype(np.float32)
    positions = rng.integers(0, 100_001, size=tokens).astype(np.int32)
    positions[0], positions[-1] = 0, 100_000  # tokens == 1 keeps only the largest
    want = NumpyOps().rope_neox(x, positions, n_rot, base)
    got = cp.asnumpy(norm_rope_cuda.rope_neox(cp.asarray(x), cp.asarray(positions), n_rot, base))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(got[..., n_rot:], x[..., n_rot:])


def test_rope_neox_at_position_zero_is_identity() -> None:
    x = np.random.default_rng(5).standard_normal((3, 4, 64)).astype(np.float32)
    got = norm_rope_cuda.rope_neox(cp.asarray(x), cp.zeros(3, dtype=cp.int32), 32, 10000.0)
    np.testing.assert_array_equal(cp.asnumpy(got), x)


@pytest.mark.parametrize("shape", [(1,), (7, 1), (33, 1407), (3, 5, 11), (8, 3 * 4096 + 1), (1 << 20,)])
def test_swiglu_matches_numpy_twin(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape))
    gate = (rng.standard_normal(shape) * 4).astype(np.float32)
    gate.flat[: min(gate.size, 4)] = [-100.0, -88.0, 30.0, 0.0][: min(gate.size, 4)]  # overflow and edge values
    up = rng.standard_normal(shape).astype(np.float32)
    with np.errstate(over="ignore"):
        want = NumpyOps().swiglu(gate, up)
    got = cp.asnumpy(norm_rope_cuda.swiglu(cp.asarray(gate), cp.asarray(up)))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-37)


@pytest.mark.parametrize("shape", [(1,), (7, 4097), (1 << 20,)])
def test_add_is_bit_exact(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(shape))
    a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    got = cp.asnumpy(norm_rope_cuda.add(cp.asarray(a), cp.asarray(b)))
    np.testing.assert_array_equal(got, a + b)


def test_wrappers_reject_wrong_dtype_layout_and_shape() -> None:
    x = cp.ones((4, 64), dtype=cp.float32)
    w = cp.ones(64, dtype=cp.float32)
    with pytest.raises(AssertionError, match="float32"):
        norm_rope_cuda.rms_norm(x.astype(cp.float64), w, 1e-6)
    with pytest.raises(AssertionError, match="C-contiguous"):
        norm_rope_cuda.rms_norm(cp.ones((64, 4), dtype=cp.float32).T, w, 1e-6)
    with pytest.raises(AssertionError, match="weight shape"):
        norm_rope_cuda.rms_norm(x, w[:32], 1e-6)
    q = cp.ones((2, 4, 64), dtype=cp.float32)
    with pytest.raises(AssertionError, match="int32"):
        norm_rope_cuda.rope_neox(q, cp.zeros(2, dtype=cp.int64), 64, 10000.0)
    with pytest.raises(AssertionError, match="n_rot"):
        norm_rope_cuda.rope_neox(q, cp.zeros(2, dtype=cp.int32), 65, 10000.0)
    with pytest.raises(AssertionError, match="differ in shape"):
        norm_rope_cuda.swiglu(x, x[:2])


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("tokens,hq,hk,head_dim,n_rot", [(1, 12, 4, 128, 128), (3, 8, 2, 64, 32), (37, 6, 6, 80, 64)])
def test_rope_store_has_the_bits_of_rope_twice_and_the_cache_writes(kv_dtype, tokens: int, hq: int, hk: int,
                                                                    head_dim: int, n_rot: int) -> None:
    """One launch in place of rope_neox(q), rope_neox(k) and the K/V writes (astype, then rows at positions):
    q out, and every row of both buffers, bit for bit, including rows it must leave alone."""
    rng = np.random.default_rng(tokens * head_dim)
    q, k, v = (cp.asarray(rng.standard_normal((tokens, h, head_dim)).astype(np.float32)) for h in (hq, hk, hk))
    slots = 64
    positions = cp.asarray(rng.choice(slots, size=tokens, replace=False).astype(np.int32))  # any rows, any order
    start = cp.asarray(rng.standard_normal((slots, hk, head_dim)).astype(kv_dtype))
    want_k, want_v = start.copy(), start.copy() + 1
    want_q = norm_rope_cuda.rope_neox(q, positions, n_rot, 1e6)
    want_k[positions] = norm_rope_cuda.rope_neox(k, positions, n_rot, 1e6).astype(kv_dtype)
    want_v[positions] = v.astype(kv_dtype)
    got_k, got_v = start.copy(), start.copy() + 1
    got_q = norm_rope_cuda.rope_store(q, k, v, got_k, got_v, positions, n_rot, 1e6)
    for got, want in ((got_q, want_q), (got_k, want_k), (got_v, want_v)):
        assert got.dtype == want.dtype and cp.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_rope_store_through_cuda_ops_equals_its_three_ops_eagerly_and_at_graph_positions() -> None:
    """CudaOps.rope_kv_store (named so `-k rope_store` selects it) against rope_neox twice and kv_store."""
    from types import SimpleNamespace

    from runner.backends.cuda.ops import CudaOps
    from runner.backends.step import Step

    ops, rng = CudaOps(), np.random.default_rng(3)
    q, k, v = (cp.asarray(rng.standard_normal((2, h, 64)).astype(np.float32)) for h in (4, 2, 2))
    positions = np.array([5, 6])
    graph = SimpleNamespace(rows=2, token=None, position=cp.asarray(positions.astype(np.int32)))
    for step in (Step(), Step(graph=graph)):
        bufs = [cp.zeros((16, 2, 64), dtype=cp.float16) for _ in range(4)]
        got = ops.rope_kv_store(q, k, v, bufs[0], bufs[1], positions, 48, 1e4, step)
        k_all, v_all = ops.kv_store(bufs[2], bufs[3], positions, ops.rope_neox(k, positions, 48, 1e4, step), v, step)
        want = (ops.rope_neox(q, positions, 48, 1e4, step), k_all, v_all)
        assert [a.shape for a in got] == [a.shape for a in want]  # eager: rows up to the end; graph: the buffers
        assert all(a.dtype == b.dtype and cp.array_equal(a.view(cp.uint8), b.view(cp.uint8)) for a, b in zip(got, want))
