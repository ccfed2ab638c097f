"""The memory of the decode, verify and draft CUDA graphs: a CuPy pool of their own, which a prompt cannot free
or reuse, so the graphs survive the prefill phase transaction.

A captured graph keeps the address of every temporary its step allocated, while CuPy's pool counts those
blocks free (no array holds them) on the graph's stream. In the default pool a prompt's region reservations
(`CudaDeviceArena._limit_pool` calls `free_all_blocks`) give such blocks back to the driver and the prompt's
buffers may land there, so every graph had to be dropped before a prompt and warmed up and captured again by
the first two steps after it. Here each graph's warm-up and capture allocate from this pool instead: nothing
but a dropped graph's `release` frees its blocks, and the pool's free lists are per stream, one per graph, so
no two graphs share a block. What a warm-up caches for good (CudaOps' index rows) lands here too and stays in
use as long as the CudaOps that owns the pool.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager


def allocating(pool: GraphPool | None) -> ContextManager:
    """Where a graph's warm-up and capture allocate: `pool`, or CuPy's default pool when None."""
    return pool.allocating() if pool is not None else contextlib.nullcontext()


class GraphPool:
    """One CuPy MemoryPool for every graph of a CudaOps; `cp` is CuPy (a stand-in in CPU tests)."""

    def __init__(self, cp: Any, limit_bytes: int = 0):
        """`limit_bytes` caps the pool like the budget caps the default pool (0: no cap)."""
        self._cp = cp
        self.pool = cp.cuda.MemoryPool()
        self.pool.set_limit(size=limit_bytes)

    def allocating(self) -> ContextManager:
        """Allocations inside come from this pool: wrap a graph's warm-up and capture in it."""
        return self._cp.cuda.using_allocator(self.pool.malloc)

    def release(self, stream: Any) -> None:
        """Give the driver back what a dropped graph's temporaries held: the free blocks of its stream."""
        self.pool.free_all_blocks(stream=stream)

    @property
    def held_bytes(self) -> int:
        return int(self.pool.total_bytes())


class CudaGraphHooks:
    """The phase transaction's graph hooks (runner/offload/backend.py's GraphHooks) on CudaOps: graphs kept
    through a prompt need nothing; dropped ones are captured again by the steps after it."""

    def __init__(self, ops: Any):
        self.ops = ops  # a CudaOps: invalidate_graphs() and graph_pool

    def invalidate(self) -> None:
        self.ops.invalidate_graphs()

    def restore(self) -> None:
        pass  # decode_forward and verify_forward capture a new graph on their own when they find none

    def held_bytes(self) -> int:
        return self.ops.graph_pool.held_bytes
