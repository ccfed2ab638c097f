"""The CUDA DeviceArena: expert slots and staging buffers in device memory, filled on a copy stream.

Regions are their own cudaMalloc allocations, outside CuPy's pool: carved from the pool, a released
cache's chunk would be split among prompt temporaries, and one small survivor in it (measured on
the H200: the 15.6 GB `--cache-slots auto` cache of a 16-layer seed model) keeps the whole chunk,
so the cache cannot be restored. The pool's limit shrinks by what the regions hold and by what the
ledger keeps for memory outside both (the decode graphs' own pool, graph_pool.py), so the pools and
regions together stay inside the budget.

Uploads run on their own non-blocking stream from the pinned host store, so they overlap the
kernels on the compute (current) stream. Two orderings make that safe:
- an upload first waits for the compute work enqueued before it, because the bytes it overwrites
  (an evicted slot, the staging buffer of the visit before last) may still be read by it;
- compute waits for an upload only through `wait(fence)`, so a layer waits for its own experts and
  never for the prefetch of the next layer.
"""

from __future__ import annotations

import itertools
from typing import Callable

import cupy as cp
import numpy as np

from runner.backends.budget import DeviceBudget
from runner.backends.cuda.copy_runs import copy_runs
from runner.offload.device_arena import DeviceRegion, check_live, check_upload
from runner.offload.host_store import ExpertLayout, HostBuffer
from runner.offload.provider import ExpertMatrices

_H2D = 1  # cudaMemcpyHostToDevice
_REGISTER_PORTABLE_MAPPED = 1 | 2  # cudaHostRegisterPortable | cudaHostRegisterMapped


def pinned_host(nbytes: int) -> HostBuffer:
    """Page-locked host memory (cudaHostAlloc) as a uint8 numpy array; raises when the driver refuses."""
    memory = cp.cuda.PinnedMemory(max(nbytes, 1))
    array = np.frombuffer(cp.cuda.PinnedMemoryPointer(memory, 0), dtype=np.uint8, count=nbytes)
    return HostBuffer(array, pinned=True)


def pin_in_place(array: np.ndarray) -> Callable[[], None]:
    """Page-lock an array's memory where it lies (cudaHostRegister), mapped so that the device reads it at its host
    address (the directory fill kernel does); returns the unlock. Raises when the driver refuses."""
    address = array.ctypes.data
    cp.cuda.runtime.hostRegister(address, max(array.nbytes, 1), _REGISTER_PORTABLE_MAPPED)
    return lambda: cp.cuda.runtime.hostUnregister(address)


class CudaDeviceArena:
    def __init__(self, budget: DeviceBudget, outside_pool: Callable[[], int] = lambda: 0):
        self.budget = budget
        self.outside_pool = outside_pool  # bytes the ledger keeps for device memory outside the pool and regions
        self.copy_stream = cp.cuda.Stream(non_blocking=True)
        self._serials = itertools.count(1)
        self.uploads = 0
        self.bytes_uploaded = 0
        self.copies = 0  # device to device
        self.bytes_copied = 0
        self.live: dict[str, DeviceRegion] = {}
        # Reused events: a wait takes an event's latest record at the time of the call, so one event per
        # role serves every upload (a new Event per call cost ~3 us on the GPU box, per miss).
        self._compute_done = cp.cuda.Event(disable_timing=True)
        self._uploads_done = cp.cuda.Event(disable_timing=True)

    def reserve(self, what: str, nbytes: int) -> DeviceRegion:
        self.budget.reserve(what, nbytes)
        try:
            self._limit_pool(self.held_bytes + nbytes)
            memory = cp.ndarray(nbytes, dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(cp.cuda.Memory(max(nbytes, 1)), 0))
        except Exception:
            self.budget.release(what)
            self._limit_pool(self.held_bytes)
            raise
        region = DeviceRegion(what, nbytes, memory, next(self._serials))
        self.live[what] = region
        return region

    @property
    def held_bytes(self) -> int:
        return sum(r.nbytes for r in self.live.values())

    def _limit_pool(self, region_bytes: int) -> None:
        """Leave the pool what the regions and the memory outside it do not hold; give cached blocks back if it
        holds more (none a kept decode graph replays into: those are in the graphs' own pool)."""
        pool = cp.get_default_memory_pool()
        room = max(0, self.budget.limit_bytes - region_bytes - self.outside_pool())
        if pool.total_bytes() > room:
            pool.free_all_blocks()
        pool.set_limit(size=room)

    def free(self, region: DeviceRegion) -> None:
        check_live(self.live, region)
        self.copy_stream.synchronize()  # no upload may still be writing into it
        cp.cuda.get_current_stream().synchronize()  # nor kernel reading from it
        del self.live[region.what]
        region.memory = None  # cudaFree once no view of it is left
        self.budget.release(region.what)
        self._limit_pool(self.held_bytes)

    def upload(self, region: DeviceRegion, offset: int, host_bytes: np.ndarray, host_address: int | None = None) -> None:
        n = host_bytes.nbytes
        check_upload(self.live, region, offset, n)
        if n == 0:
            return
        assert host_bytes.flags.c_contiguous
        self._compute_done.record(cp.cuda.get_current_stream())
        self.copy_stream.wait_event(self._compute_done)
        cp.cuda.runtime.memcpyAsync(region.memory.data.ptr + offset,
                                    host_bytes.ctypes.data if host_address is None else host_address, n, _H2D,
                                    self.copy_stream.ptr)
        self.uploads += 1
        self.bytes_uploaded += n

    def copy_experts(self, dst: DeviceRegion, dst_offsets: list[int], src: DeviceRegion, src_offsets: list[int],
                     nbytes: int) -> None:
        """Warm fill from staging: one copy kernel (cuda/copy_runs.cu) on the compute stream, which the caller has
        made wait for src's upload (PrefillStream: the visit's fence), so after it; and before the next upload
        into src, which waits for the compute enqueued before it. On the copy stream, 150 copy-engine calls of
        2 MB each held the next layer's upload back by about 3.7 ms a layer on the 48-layer seed shape (H200)."""
        if nbytes == 0 or not dst_offsets:
            return
        for d, s in zip(dst_offsets, src_offsets, strict=True):
            check_upload(self.live, dst, d, nbytes)
            check_upload(self.live, src, s, nbytes)
        copy_runs(dst.memory.data.ptr, dst_offsets, src.memory.data.ptr, src_offsets, nbytes)
        self.copies += len(dst_offsets)
        self.bytes_copied += nbytes * len(dst_offsets)

    def fence(self) -> cp.cuda.Event:
        return self.copy_stream.record()

    def wait(self, fence: cp.cuda.Event | None) -> None:
        if fence is not None:
            cp.cuda.get_current_stream().wait_event(fence)

    def wait_uploads(self) -> None:
        self._uploads_done.record(self.copy_stream)
        cp.cuda.get_current_stream().wait_event(self._uploads_done)

    def view(self, region: DeviceRegion, offset: int, layout: ExpertLayout) -> ExpertMatrices:
        n = layout.expert_bytes
        return layout.matrices(region.memory[offset : offset + n], key=f"cuda:{region.serial}@{offset}")

    def address(self, region: DeviceRegion, offset: int) -> int:
        check_live(self.live, region)
        return region.memory.data.ptr + offset  # a view's `.data.ptr`

    def synchronize(self) -> None:
        self.copy_stream.synchronize()
