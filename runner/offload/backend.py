"""What a backend supplies to expert offload, and the numpy backend's emulation of it.

A backend hands over an `OffloadBackend`: the DeviceBudget every reservation goes through, a
DeviceArena, the host allocator (pinned on CUDA) and what the phase transaction drives: decode
workspaces (released during a prompt), the decode graphs' share of them (kept through a prompt when
the prompt fits beside it, else released with the rest) and the decode graphs themselves (kept, or
invalidated and restored around the prompt).
On numpy, `emulated_backend` builds a budget of the configured size holding what the CUDA backend
would keep resident (weights other than routed experts, the KV cache), so the same arithmetic runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from runner.backends.budget import DeviceBudget
from runner.backends.kv_type import DEFAULT_KV_TYPE
from runner.models.config import ModelConfig
from runner.models.weights import ModelWeights, is_routed_expert
from runner.offload.device_arena import DeviceArena, EmulatedDeviceArena
from runner.offload.host_store import HostPinner
from runner.offload.sizing import decode_graph_bytes, decode_reservation_bytes, kv_cache_bytes


class Workspaces(Protocol):
    nbytes: int

    @property
    def reserved(self) -> bool: ...

    def reserve(self) -> None: ...

    def release(self) -> None: ...


class GraphHooks(Protocol):
    def invalidate(self) -> None:
        """Drop captured decode graphs and give back the memory their temporaries held."""
        ...

    def restore(self) -> None:
        """Make decode graphs valid again (recapture, now or at the next step)."""
        ...

    def held_bytes(self) -> int:
        """Device bytes the graphs' temporaries hold now (CUDA: their own pool), for stats."""
        ...


class BudgetWorkspaces:
    """Decode workspaces as one named reservation of `nbytes`, on both backends: an estimate
    (sizing.decode_reservation_bytes, in two parts: decode_workspaces) that keeps room in the ledger for
    the decode activations and the decode attention's partials, not a buffer. Releasing it during a
    prompt frees nothing on the device by itself; it lets the prefill buffers take that room."""

    def __init__(self, budget: DeviceBudget, nbytes: int, what: str = "decode workspaces"):
        self.budget, self.nbytes, self.what = budget, nbytes, what

    @property
    def reserved(self) -> bool:
        return self.what in self.budget.held

    @property
    def held_bytes(self) -> int:
        return self.nbytes if self.reserved else 0

    def reserve(self) -> None:
        self.budget.reserve(self.what, self.nbytes)

    def release(self) -> None:
        self.budget.release(self.what)


@dataclass
class CountingGraphs:
    """No graphs to drop on numpy; counts the calls so tests can check the transaction made them."""

    invalidations: int = 0
    restores: int = 0

    def invalidate(self) -> None:
        self.invalidations += 1

    def restore(self) -> None:
        self.restores += 1

    def held_bytes(self) -> int:
        return 0


@dataclass
class OffloadBackend:
    budget: DeviceBudget
    arena: DeviceArena
    workspaces: Workspaces
    graphs: GraphHooks = field(default_factory=CountingGraphs)
    pin_host: HostPinner | None = None  # None: the host expert store stays pageable (numpy)
    require_pinned: bool = False
    prefill_scratch_bytes: int = 0  # the backend's own prefill temporaries beyond the activations (CUDA: expert GEMM chunks)
    graph_workspaces: Workspaces | None = None  # the decode graphs' share, reserved apart from `workspaces`
    directories: Callable[[Any], Any] | None = None  # slot cache -> its device directories (CUDA); None: none


def resident_bytes(weights: ModelWeights) -> int:
    """Everything the GPU keeps resident: all tensors except the routed experts."""
    return sum(t.nbytes for t in weights.all_tensors() if not is_routed_expert(t.name))


def emulated_backend(cfg: ModelConfig, weights: ModelWeights, n_ctx: int, vram_budget_bytes: int,
                     kv_type: str = DEFAULT_KV_TYPE, decode_batch: int = 1) -> OffloadBackend:
    budget = DeviceBudget(vram_budget_bytes)
    budget.reserve("resident weights", resident_bytes(weights))
    budget.reserve("kv cache", kv_cache_bytes(cfg, n_ctx, kv_type))
    workspaces, graphs = decode_workspaces(budget, cfg, n_ctx, decode_batch)
    return OffloadBackend(budget, EmulatedDeviceArena(budget), workspaces, graph_workspaces=graphs)


def decode_workspaces(budget: DeviceBudget, cfg: ModelConfig, n_ctx: int, decode_batch: int = 1,
                      graphs: bool = True) -> tuple[BudgetWorkspaces, BudgetWorkspaces | None]:
    """decode_reservation_bytes as two reservations: "decode workspaces" (eager batches' room, released during
    every prompt) and "decode graphs" (decode_graph_bytes, kept through prompts that fit beside it); without
    `graphs` (eager decode) all of it is the first."""
    total = decode_reservation_bytes(cfg, n_ctx, decode_batch)
    if not graphs:
        return BudgetWorkspaces(budget, total), None
    share = decode_graph_bytes(cfg, n_ctx, decode_batch)
    return BudgetWorkspaces(budget, total - share), BudgetWorkspaces(budget, share, "decode graphs")


def backend_for(ops: Any, cfg: ModelConfig, weights: ModelWeights, n_ctx: int, vram_budget_bytes: int,
                decode_batch: int = 1) -> OffloadBackend:
    """The ops backend's own (`ops.offload_backend(...)`, CUDA) or the numpy emulation; `decode_batch` rows
    the largest verify batch (the decode workspaces hold a graph per batch size)."""
    make = getattr(ops, "offload_backend", None)
    if make is not None:
        return make(cfg, weights, n_ctx, decode_batch)
    return emulated_backend(cfg, weights, n_ctx, vram_budget_bytes, ops.kv_type, decode_batch)
