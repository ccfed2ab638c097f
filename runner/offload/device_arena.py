"""Device memory for expert slots and prefill staging, reserved through the VRAM budget.

`DeviceArena` is what the slot cache and the prefill stream need from a backend: regions reserved
by name in the DeviceBudget, host-to-device uploads (on a copy stream on CUDA), device-to-device copies
(the warm fill from staging: one kernel on the compute stream on CUDA), fences that compute waits on, and ExpertMatrices views of uploaded experts. `EmulatedDeviceArena` is the numpy twin:
its "device" memory is numpy arrays, so CPU tests check the accounting, and it poisons memory that
was never uploaded or was freed (0xFF bytes: NaN as F32) so a stale read shows in the output.
"""

from __future__ import annotations

import bisect
import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from runner.backends.budget import DeviceBudget
from runner.offload.host_store import ExpertLayout
from runner.offload.provider import ExpertMatrices

POISON = 0xFF


class UploadVersions:
    """Which upload last wrote each byte range of a region: disjoint [start, end) -> upload number."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._spans: dict[int, tuple[int, int]] = {}  # start -> (end, upload)

    def write(self, start: int, end: int, upload: int) -> None:
        lo = max(bisect.bisect_right(self._starts, start) - 1, 0)
        hi = bisect.bisect_left(self._starts, end)
        pieces = [(start, end, upload)]
        for s in self._starts[lo:hi]:
            e, u = self._spans.pop(s)
            if e <= start:
                pieces.append((s, e, u))  # ends before the new span
                continue
            if s < start:
                pieces.append((s, start, u))  # the old span's parts outside the new one survive
            if e > end:
                pieces.append((end, e, u))
        for s, e, u in pieces:
            self._spans[s] = (e, u)
        self._starts[lo:hi] = sorted(p[0] for p in pieces)

    def latest(self, start: int, end: int) -> int:
        """The newest upload that wrote any byte of [start, end) (0: none did)."""
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        newest = 0
        while i < len(self._starts) and self._starts[i] < end:
            e, u = self._spans[self._starts[i]]
            if e > start:
                newest = max(newest, u)
            i += 1
        return newest


@dataclass(eq=False)
class DeviceRegion:
    what: str  # its name in the budget
    nbytes: int
    memory: Any  # backend array, uint8 [nbytes]
    serial: int = 0
    versions: UploadVersions = field(default_factory=UploadVersions)


def check_live(live: dict[str, "DeviceRegion"], region: "DeviceRegion") -> None:
    """A region freed (or from another arena) must not be used again."""
    if live.get(region.what) is not region:
        raise ValueError(f"region '{region.what}' is not live in this arena")


def check_upload(live: dict[str, "DeviceRegion"], region: "DeviceRegion", offset: int, nbytes: int) -> None:
    """An upload goes into a live region and stays inside it."""
    check_live(live, region)
    if offset < 0 or offset + nbytes > region.nbytes:
        raise ValueError(f"upload of {nbytes} bytes at {offset} overruns '{region.what}' ({region.nbytes} bytes)")


class DeviceArena(Protocol):
    budget: DeviceBudget

    def reserve(self, what: str, nbytes: int) -> DeviceRegion:
        """Reserve `nbytes` named `what` in the budget and allocate them (DeviceMemoryError if they do not fit)."""
        ...

    def free(self, region: DeviceRegion) -> None:
        """Give the memory and its reservation back; views of it are invalid from here on."""
        ...

    def upload(self, region: DeviceRegion, offset: int, host_bytes: np.ndarray, host_address: int | None = None) -> None:
        """Enqueue a copy of 1-D uint8 host bytes to region[offset:] (on the copy stream). `host_address`
        is host_bytes' address when the caller knows it: numpy's `.ctypes.data` costs microseconds."""
        ...

    def copy_experts(self, dst: DeviceRegion, dst_offsets: list[int], src: DeviceRegion, src_offsets: list[int],
                     nbytes: int) -> None:
        """Enqueue device-to-device copies of `nbytes` each, src[src_offsets[i]:] to dst[dst_offsets[i]:], on the
        compute stream, after the compute enqueued before (the caller waits on src's upload first): no PCIe bytes."""
        ...

    def fence(self) -> Any:
        """A marker after every upload enqueued so far (a CUDA event on the copy stream)."""
        ...

    def wait(self, fence: Any) -> None:
        """Make compute wait for the uploads before `fence` (and only those)."""
        ...

    def wait_uploads(self) -> None:
        """wait(fence()) for a wait made now, with no fence kept: the CUDA arena reuses one event."""
        ...

    def view(self, region: DeviceRegion, offset: int, layout: ExpertLayout) -> ExpertMatrices:
        """The expert whose bytes were uploaded at region[offset:], as matrices."""
        ...

    def address(self, region: DeviceRegion, offset: int) -> int:
        """The device address of region[offset] (what a view starting there reports as its pointer)."""
        ...

    def synchronize(self) -> None:
        """Wait for every upload (quiesce)."""
        ...


class EmulatedDeviceArena:
    """DeviceArena on numpy arrays: uploads are immediate copies, fences are upload counts."""

    def __init__(self, budget: DeviceBudget):
        self.budget = budget
        self.token = uuid.uuid4().hex[:8]  # keys of two arenas never collide in one dequant cache
        self._serials = itertools.count(1)
        self.uploads = 0
        self.bytes_uploaded = 0
        self.copies = 0  # device to device
        self.bytes_copied = 0
        self._writes = itertools.count(1)  # versions of uploads and copies alike, so a view's key is new after either
        self.live: dict[str, DeviceRegion] = {}

    def reserve(self, what: str, nbytes: int) -> DeviceRegion:
        self.budget.reserve(what, nbytes)
        region = DeviceRegion(what, nbytes, np.full(nbytes, POISON, dtype=np.uint8), next(self._serials))
        self.live[what] = region
        return region

    def free(self, region: DeviceRegion) -> None:
        check_live(self.live, region)
        self.budget.release(region.what)
        region.memory[:] = POISON  # any view still held now reads NaN
        region.versions = UploadVersions()
        del self.live[region.what]

    def upload(self, region: DeviceRegion, offset: int, host_bytes: np.ndarray, host_address: int | None = None) -> None:
        n = host_bytes.nbytes
        check_upload(self.live, region, offset, n)
        if host_address is not None and host_address != host_bytes.ctypes.data:
            raise ValueError(f"upload: host address {host_address:#x} is not the bytes' {host_bytes.ctypes.data:#x}")
        region.memory[offset : offset + n] = host_bytes.reshape(-1).view(np.uint8)
        self.uploads += 1
        self.bytes_uploaded += n
        region.versions.write(offset, offset + n, next(self._writes))

    def copy_experts(self, dst: DeviceRegion, dst_offsets: list[int], src: DeviceRegion, src_offsets: list[int],
                     nbytes: int) -> None:
        for d, s in zip(dst_offsets, src_offsets, strict=True):
            check_upload(self.live, dst, d, nbytes)
            check_upload(self.live, src, s, nbytes)
            if src.versions.latest(s, s + nbytes) == 0:
                raise ValueError(f"copy from '{src.what}' at {s}: those bytes were never written")
            dst.memory[d : d + nbytes] = src.memory[s : s + nbytes]
            dst.versions.write(d, d + nbytes, next(self._writes))
            self.copies += 1
            self.bytes_copied += nbytes

    def fence(self) -> int:
        return self.uploads

    def wait(self, fence: Any) -> None:
        assert fence is None or fence <= self.uploads

    def wait_uploads(self) -> None:
        self.wait(self.fence())

    def view(self, region: DeviceRegion, offset: int, layout: ExpertLayout) -> ExpertMatrices:
        n = layout.expert_bytes
        version = region.versions.latest(offset, offset + n)  # 0: never uploaded (poison)
        key = f"dev:{self.token}:{region.serial}@{offset}#{version}"
        return layout.matrices(region.memory[offset : offset + n], key)

    def address(self, region: DeviceRegion, offset: int) -> int:
        check_live(self.live, region)
        return region.memory.ctypes.data + offset  # a view's `.ctypes.data`, numpy's pointer

    def synchronize(self) -> None:
        pass
