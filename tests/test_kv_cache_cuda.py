"""CudaOps' K/V cache in both element types (--cache-type f16, the default, or f32): buffers reserved at
their real size, rows rounded as numpy rounds them (to nearest even: the same bits on both backends),
written at the batch's positions or, inside a decode graph, at the device-side position."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.budget import DeviceBudget  # noqa: E402
from runner.backends.cuda.ops import CudaOps  # noqa: E402
from runner.backends.kv_type import KV_TYPES  # noqa: E402
from runner.backends.numpy.ops import NumpyOps  # noqa: E402
from runner.backends.step import Step  # noqa: E402
from runner.engine.kv_cache import KVCache  # noqa: E402

KV = ["f16", "f32"]


def _rows(seed: int, n: int) -> np.ndarray:
    """Float32 K rows [n, 2, 64] with the awkward values: ties between f16 neighbours, subnormals, past f16's range."""
    k = np.random.default_rng(seed).standard_normal((n, 2, 64)).astype(np.float32)
    k[0, 0, :6] = [1 + 2**-11, 1 + 3 * 2**-11, -(2 + 2**-10), 3e-6, 70000.0, -1e-8]
    return k


@pytest.mark.parametrize("kv_type", KV)
def test_buffers_are_reserved_at_their_real_size(kv_type: str) -> None:
    budget = DeviceBudget(1 << 30)
    kv = KVCache(CudaOps(budget, kv_type=kv_type), 3, 100, 2, 64)
    size = KV_TYPES[kv_type].itemsize
    assert kv.k[0].dtype == KV_TYPES[kv_type] and budget.used_bytes == 2 * 3 * 100 * 2 * 64 * size
    assert all(kv_type in what or KV_TYPES[kv_type].name in what for what in budget.held)


@pytest.mark.parametrize("kv_type", KV)
def test_stored_rows_have_numpy_s_bits(kv_type: str) -> None:
    gpu, cpu = KVCache(CudaOps(kv_type=kv_type), 1, 32, 2, 64), KVCache(NumpyOps(kv_type=kv_type), 1, 32, 2, 64)
    k = _rows(1, 7)
    with np.errstate(over="ignore"):
        want_k, want_v = cpu.store(0, np.arange(5, 12), k, -k, None)
    got_k, got_v = gpu.store(0, np.arange(5, 12), cp.asarray(k), cp.asarray(-k), Step())
    assert got_k.shape == (12, 2, 64) and got_k.dtype == KV_TYPES[kv_type]
    for got, want in ((got_k, want_k), (got_v, want_v)):
        assert np.array_equal(cp.asnumpy(got).view(np.uint8), want.view(np.uint8))  # bits, inf and signed zeros too


@pytest.mark.parametrize("kv_type", KV)
def test_a_graph_step_writes_at_its_device_position_and_sees_the_whole_buffer(kv_type: str) -> None:
    kv = KVCache(CudaOps(kv_type=kv_type), 1, 16, 2, 64)
    graph = SimpleNamespace(token=cp.zeros(1, dtype=cp.int64), position=cp.asarray(np.array([9], dtype=np.int32)))
    k = _rows(2, 1)
    got_k, got_v = kv.store(0, np.arange(0, 1), cp.asarray(k), cp.asarray(2 * k), Step(graph=graph))
    assert got_k is kv.k[0] and got_v is kv.v[0]  # attention masks the whole buffer by position
    host_k, host_v = cp.asnumpy(kv.k[0]), cp.asnumpy(kv.v[0])
    with np.errstate(over="ignore"):
        assert np.array_equal(host_k[9].view(np.uint8), k[0].astype(KV_TYPES[kv_type]).view(np.uint8))
        assert np.array_equal(host_v[9], (2 * k[0]).astype(KV_TYPES[kv_type]))
    assert not np.delete(host_k, 9, axis=0).any()  # no other row written
