"""Counters for kernels whose last block to finish does the launch's final step (in gemv.cu the router's ranking,
gemv_norm_route, and the expert sum after the down products, expert_down_combine): each block adds one when its
part is written, and the block that brings its counter to the launch's count finishes and sets it back to zero.

They live in raw device memory outside any pool (a graph's pool must not own them), zeroed once, so two launches
that share a counter must not run at once: the runner decodes on one stream at a time, but for a prefetch's guess
(its own router slot, ROUTER_BESIDE). Each user has its own range. The first call must not be inside a capture (a
decode graph's eager warm-up comes first).
"""

from __future__ import annotations

import cupy as cp

ROUTER = 0  # the normed router's launch (gemv_cuda.gemv_norm_route)
COMBINE = slice(1, 1 + 4096)  # the down products' column tiles (gemv_cuda.expert_down_combine)
ROUTER_BESIDE = 1 + 4096  # a normed router's launch on another stream beside ROUTER's (a prefetch's guess)
_COUNT = 2 + 4096
_counters: dict[int, cp.ndarray] = {}  # device id -> uint32 [_COUNT]


def counters() -> cp.ndarray:
    """This device's counters, uint32 [_COUNT], all zero between launches."""
    device = cp.cuda.Device().id
    if device not in _counters:
        assert not cp.cuda.get_current_stream().is_capturing(), "the last-block counters are made outside a capture"
        memory = cp.cuda.MemoryPointer(cp.cuda.Memory(_COUNT * 4), 0)
        cp.cuda.runtime.memset(memory.ptr, 0, _COUNT * 4)
        cp.cuda.runtime.deviceSynchronize()  # the memset is done before any stream's launch reads the counters
        _counters[device] = cp.ndarray((_COUNT,), dtype=cp.uint32, memptr=memory)
    return _counters[device]
