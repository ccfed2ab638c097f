"""The CUDA timeline clock: event pairs on the arena's copy stream and the compute stream (GPU box only)."""

from __future__ import annotations

import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.budget import GIB, DeviceBudget  # noqa: E402
from runner.backends.cuda.expert_arena import CudaDeviceArena, pinned_host  # noqa: E402
from runner.offload.timeline import CudaEventClock, Timeline  # noqa: E402


def test_copy_and_compute_spans_are_gpu_times_on_their_own_streams() -> None:
    arena = CudaDeviceArena(DeviceBudget(4 * GIB))
    region = arena.reserve("staging", 256 << 20)
    host = pinned_host(256 << 20).array
    host[:] = 7
    a = cp.ones((4096, 4096), dtype=cp.float32)
    tl = Timeline(CudaEventClock(arena.copy_stream))
    assert tl.clock.gpu
    copy = tl.start("copy", 1, "visit 0")
    arena.upload(region, 0, host)
    tl.stop(copy)
    compute = tl.start("compute", 1, "visit 0")
    for _ in range(20):
        a = a @ a / 4096.0
    tl.stop(compute)
    spans = tl.spans()  # synchronizes both streams
    by_stream = {s.stream: s for s in spans}
    assert set(by_stream) == {"copy", "compute"}
    # 256 MiB over PCIe takes milliseconds, far more than event resolution; and far less than a second.
    assert 1e-4 < by_stream["copy"].duration_s < 1.0
    assert by_stream["compute"].duration_s > 0
    assert int(region.memory[:16].get().sum()) == 7 * 16
    assert all(s.start_s >= 0 for s in spans)


def test_a_wait_span_times_the_compute_streams_wait_for_an_upload() -> None:
    """The prefill stream brackets arena.wait(fence) with a "wait" span: on the GPU it lasts while the upload
    the compute stream waits for is still crossing, and about nothing once the upload is done."""
    arena = CudaDeviceArena(DeviceBudget(4 * GIB))
    region = arena.reserve("staging", 512 << 20)
    host = pinned_host(512 << 20).array
    tl = Timeline(CudaEventClock(arena.copy_stream))
    arena.upload(region, 0, host)
    fence = arena.fence()
    waiting = tl.start("wait", 1, "visit 0")
    arena.wait(fence)
    tl.stop(waiting)
    cp.cuda.get_current_stream().synchronize()
    again = tl.start("wait", 1, "visit 0")
    arena.wait(fence)
    tl.stop(again)
    first, second = tl.spans()
    assert first.stream == "wait" and first.duration_s > 1e-3  # 512 MiB over PCIe: several milliseconds
    assert second.duration_s < first.duration_s / 10
