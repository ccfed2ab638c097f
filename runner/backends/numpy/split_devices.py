"""The numpy emulation of a launch split by layer across cards (launch/devices.py makes the plan).

Each card is its own DeviceBudget and EmulatedDeviceArena; its layers' weights, K/V and expert slots,
and its decode workspaces, are reserved there as the CUDA backend would hold them, so a model that
does not fit one budget is refused or placed the same way. A forward copies the hidden state into
the next card's receive buffer at each boundary (a counted transfer, as a peer copy would be on CUDA).
The routed experts are read from host RAM as every numpy forward reads them; the slots are accounted
on their card, not run as a cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from runner.backends.budget import DeviceBudget
from runner.backends.step import RESIDENT, Step
from runner.launch.devices import DevicePlan, PlanCosts
from runner.offload.device_arena import DeviceRegion, EmulatedDeviceArena

F32 = 4


@dataclass
class Transfers:
    """Hidden-state copies between cards: how many and how many bytes."""

    count: int = 0
    nbytes: int = 0


class EmulatedDevices:
    """One budget and arena per card of `plan`, holding the plan's reservations and a receive buffer of
    `max_rows` hidden rows on every card after the first."""

    def __init__(self, plan: DevicePlan, costs: PlanCosts, n_embd: int, max_rows: int):
        self.plan = plan
        self.budgets = [DeviceBudget(s.budget_bytes) for s in plan.shares]
        self.arenas = [EmulatedDeviceArena(b) for b in self.budgets]
        self.transfers = Transfers()
        self.budgets[0].reserve("token embedding", costs.embedding)
        self.budgets[-1].reserve("output head", costs.head)
        for budget in self.budgets:
            budget.reserve("decode workspaces", costs.workspace)
        for i, layer in enumerate(costs.layers):
            budget = self.budgets[plan.device_index(i)]
            budget.reserve(f"blk.{i} weights", layer.weights)
            budget.reserve(f"blk.{i} kv", layer.kv)
            if layer.slots:
                budget.reserve(f"blk.{i} expert slots", layer.slots)
        self.n_embd = n_embd
        assert costs.receive == max_rows * n_embd * F32, "the plan counts the receive buffers reserved here"
        self.inbox: list[DeviceRegion | None] = [None] + [
            arena.reserve(f"hidden state from {prev.name}", costs.receive)
            for arena, prev in zip(self.arenas[1:], plan.shares[:-1])]

    def move(self, x: np.ndarray, card: int) -> np.ndarray:
        """`x` [T, n_embd] copied into card `card`'s receive buffer, read back from there."""
        region = self.inbox[card]
        assert region is not None, "the first card receives nothing"
        host = np.ascontiguousarray(x, dtype=np.float32)
        self.arenas[card].upload(region, 0, host.reshape(-1).view(np.uint8))
        self.transfers.count += 1
        self.transfers.nbytes += host.nbytes
        return region.memory[: host.nbytes].view(np.float32).reshape(host.shape).copy()

    def stats(self) -> dict[str, Any]:
        return {"split": self.plan.summary(), "transfers": self.transfers.count,
                "transfer_bytes": self.transfers.nbytes,
                "devices": [{"device": s.name, "limit_bytes": b.limit_bytes, "peak_bytes": b.peak_bytes}
                            for s, b in zip(self.plan.shares, self.budgets)]}


class SplitModel:
    """A trunk run across the cards of `devices`: MoETransformer.forward's operations in its order, with the
    hidden state moved at each boundary. Everything else (caches, head, NextN) is the wrapped model's."""

    def __init__(self, model: Any, devices: EmulatedDevices):
        self.model, self.devices = model, devices
        self._card_from = {layer: k for k, layer in enumerate(devices.plan.boundaries, start=1)}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def forward(self, tokens: np.ndarray, kv: Any, all_logits: bool = False,
                before_layer: Callable[[int], None] | None = None,
                after_layer: Callable[[int], None] | None = None, step: Step = RESIDENT) -> tuple[Any, Any]:
        m = self.model
        positions = kv.positions(len(tokens))
        x = m.ops.embed(m.weights.token_embd, np.asarray(tokens), step)
        for i in range(len(m.weights.layers)):
            if i in self._card_from:
                x = self.devices.move(x, self._card_from[i])
            if before_layer is not None:
                before_layer(i)
            x = x + m.mixer(i, x, positions, kv, step)
            x = x + m.ffn(i, x, step)
            if after_layer is not None:
                after_layer(i)
        kv.advance(len(tokens))
        return m.head(x, all_logits)
