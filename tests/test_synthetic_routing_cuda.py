"""SyntheticRouting.ids_for on CuPy ids: the host table's rows, gathered on the device, and inside a captured
CUDA graph from the position buffer the graph reads at each replay (no host read at capture time)."""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available
from runner.offload.synthetic_routing import RoutingMode, SyntheticRouting

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402


@pytest.fixture(scope="module")
def routing() -> SyntheticRouting:
    r = SyntheticRouting.for_shape(RoutingMode.parse("locality-qwen3-30b-a3b"), 128, 8, layers=[1, 2], n_positions=64)
    r.upload()
    return r


def test_cupy_ids_are_the_host_rows_at_host_positions(routing) -> None:
    ids = cp.zeros((3, 8), dtype=cp.int32)
    got = routing.ids_for(2, ids, np.array([5, 6, 7]))
    assert isinstance(got, cp.ndarray) and got.dtype == cp.int32 and got.flags.c_contiguous
    assert np.array_equal(cp.asnumpy(got), routing._host[2][5:8])


def test_a_captured_graph_reads_the_position_buffer_at_each_replay(routing) -> None:
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        position = cp.zeros(1, dtype=cp.int32)
        ids = cp.zeros((1, 8), dtype=cp.int32)
        routing.ids_for(1, ids, np.array([0]), position)  # warm-up: the pool holds the output's block
        stream.synchronize()
        stream.begin_capture()
        out = routing.ids_for(1, ids, np.array([0]), position)  # the host positions are stale on purpose
        graph = stream.end_capture()
        for p in (3, 40, 63):
            position.set(np.array([p], dtype=np.int32), stream=stream)
            graph.launch(stream=stream)
            stream.synchronize()
            assert out.shape == (1, 8) and out.dtype == cp.int32
            assert np.array_equal(cp.asnumpy(out)[0], routing._host[1][p])
