"""One ledger for device memory: every allocation is reserved by name against a fixed budget.

A 24 GB card is emulated on a bigger GPU by giving the budget 24 GiB; the expert cache, the KV cache
and the prefill buffers all reserve here first, so going over is a clear error naming what did not
fit instead of a CUDA out-of-memory deep inside a kernel launch. Pure bookkeeping: it runs (and is
tested) without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from runner.errors import DeviceMemoryError

GIB = 1 << 30


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass
class DeviceBudget:
    limit_bytes: int
    held: dict[str, int] = field(default_factory=dict)
    peak_bytes: int = 0

    def __post_init__(self) -> None:
        if self.limit_bytes <= 0:
            raise DeviceMemoryError(f"the VRAM budget must be positive, got {self.limit_bytes} bytes")

    @property
    def used_bytes(self) -> int:
        return sum(self.held.values())

    @property
    def free_bytes(self) -> int:
        return self.limit_bytes - self.used_bytes

    def check_fits(self, items: Iterable[tuple[str, int]]) -> None:
        """Refuse, before anything is allocated, reservations that would not fit together: the first one
        that would not is named, as reserve() names it. (Uploading until one fails would leave the
        device's allocator to fail first, with an out-of-memory that names nothing.)"""
        free = self.free_bytes
        for what, nbytes in items:
            if nbytes > free:
                raise DeviceMemoryError(
                    f"{what} needs {_gib(nbytes)} but only {_gib(free)} of the {_gib(self.limit_bytes)} VRAM budget "
                    f"is free once everything before it is placed"
                )
            free -= nbytes

    def reserve(self, what: str, nbytes: int) -> None:
        """Account `nbytes` for `what`, or raise naming it, the shortfall and the biggest holders."""
        if nbytes < 0:
            raise ValueError(f"cannot reserve {nbytes} bytes for {what}")
        if what in self.held:
            raise ValueError(f"'{what}' is already reserved ({self.held[what]} bytes)")
        if nbytes > self.free_bytes:
            top = sorted(self.held.items(), key=lambda kv: -kv[1])[:3]
            holders = ", ".join(f"{name} {_gib(n)}" for name, n in top) or "nothing"
            raise DeviceMemoryError(
                f"{what} needs {_gib(nbytes)} but only {_gib(self.free_bytes)} of the {_gib(self.limit_bytes)} "
                f"VRAM budget is free (held: {holders})"
            )
        self.held[what] = nbytes
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)

    def release(self, what: str) -> int:
        """Give back what `what` held; returns its size."""
        if what not in self.held:
            raise ValueError(f"'{what}' holds no reservation")
        return self.held.pop(what)
