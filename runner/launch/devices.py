"""`--devices 0,1`: which cards a launch runs on, and which contiguous layers each one holds.

A layer's dense weights, its K/V (or DeltaNet state) and its expert slots live on one card; the
embedding goes on the first card, the output head (and any NextN block, which runs after it) on the
last, and every card keeps its own decode workspaces. The split minimises the fullest card's share of
its budget, so the hidden state crosses each boundary once per forward. Pure arithmetic: no device.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runner.backends.kv_type import DEFAULT_KV_TYPE, check_kv_type
from runner.errors import DeviceMemoryError, ProfileError
from runner.models.weights import is_routed_expert
from runner.units import size_text

if TYPE_CHECKING:
    from runner.gguf_file import GGUFFile
    from runner.models.config import ModelConfig

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def parse_devices(text: str, visible: int | None = None) -> tuple[int, ...]:
    """`--devices 0,1`: distinct non-negative ids, each below `visible` (the devices the backend sees; None: unchecked)."""
    parts = [p.strip() for p in str(text).split(",")]
    if not all(re.fullmatch(r"-?\d+", p) for p in parts):
        raise ProfileError(f"--devices takes comma-separated device ids such as 0,1, got '{text}'")
    ids = tuple(int(p) for p in parts)
    negative = [i for i in ids if i < 0]
    if negative:
        raise ProfileError(f"--devices: device id {negative[0]} is negative; ids count from 0")
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ProfileError(f"--devices: device {repeated[0]} is named twice; name each card once")
    if visible is not None and max(ids) >= visible:
        raise ProfileError(f"--devices: device {max(ids)} does not exist; the backend sees {visible} "
                           f"device{'s' if visible != 1 else ''} (ids 0-{visible - 1})" if visible else
                           f"--devices: device {max(ids)} does not exist; the backend sees no device")
    return ids


@dataclass(frozen=True)
class LayerBytes:
    """What one trunk layer keeps on its card."""

    weights: int  # dense weights (and the routed experts when they are resident)
    kv: int  # K/V for the context, or a DeltaNet layer's state
    slots: int  # expert cache slots (0: experts resident, counted in weights)

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.slots


@dataclass(frozen=True)
class PlanCosts:
    """Bytes by layer and the fixed pieces the plan places: the embedding, the head, each card's workspaces."""

    layers: tuple[LayerBytes, ...]
    embedding: int  # on the first card
    head: int  # output norm and projection (a tied head is a second copy), NextN blocks: on the last card
    workspace: int  # decode activations, on every card
    receive: int = 0  # the hidden state's receive buffer, on every card after the first


@dataclass(frozen=True)
class DeviceShare:
    device: int
    first: int  # first trunk layer held
    last: int  # last trunk layer held (inclusive)
    used_bytes: int
    budget_bytes: int

    @property
    def name(self) -> str:
        return f"cuda:{self.device}"

    @property
    def layers(self) -> str:
        return f"{self.first}-{self.last}" if self.last > self.first else str(self.first)


@dataclass(frozen=True)
class DevicePlan:
    shares: tuple[DeviceShare, ...]

    def device_index(self, layer: int) -> int:
        """Which share (0 = the first card) holds trunk layer `layer`."""
        for k, s in enumerate(self.shares):
            if s.first <= layer <= s.last:
                return k
        raise IndexError(f"layer {layer} is in no share of the plan")

    @property
    def boundaries(self) -> tuple[int, ...]:
        """The first layer of every card after the first: where the hidden state changes card."""
        return tuple(s.first for s in self.shares[1:])

    def summary(self) -> str:
        """`layers 0-23 on cuda:0 (19.41 GiB of 24.00 GiB), 24-47 on cuda:1 (...)`."""
        return "layers " + ", ".join(f"{s.layers} on {s.name} ({size_text(s.used_bytes)} of "
                                     f"{size_text(s.budget_bytes)})" for s in self.shares)


def plan_devices(devices: Sequence[int], budgets: Sequence[int], costs: PlanCosts) -> DevicePlan:
    """Contiguous layer ranges, one per device in order, that minimise the fullest card's share of its budget;
    DeviceMemoryError (one line) when no split fits."""
    n, d = len(costs.layers), len(devices)
    if len(budgets) != d:
        raise ValueError(f"{d} devices but {len(budgets)} budgets")
    if d > n:
        raise DeviceMemoryError(f"--devices names {d} cards but the model has {n} layers; name at most {n}")
    prefix = [0]
    for layer in costs.layers:
        prefix.append(prefix[-1] + layer.total)

    def used(k: int, lo: int, hi: int) -> int:  # card k holding layers lo..hi-1
        return (prefix[hi] - prefix[lo] + costs.workspace + (costs.embedding if k == 0 else costs.receive)
                + (costs.head if k == d - 1 else 0))

    inf = float("inf")
    # best[k][j]: the lowest fullest-card ratio placing layers 0..j-1 on cards 0..k; cut[k][j]: card k's first layer
    best = [[inf] * (n + 1) for _ in range(d)]
    cut = [[0] * (n + 1) for _ in range(d)]
    for j in range(1, n + 1):
        best[0][j] = used(0, 0, j) / budgets[0]
    for k in range(1, d):
        for j in range(k + 1, n + 1):
            for i in range(k, j):
                r = max(best[k - 1][i], used(k, i, j) / budgets[k])
                if r < best[k][j]:
                    best[k][j], cut[k][j] = r, i
    if best[d - 1][n] > 1.0:
        total = prefix[n] + costs.embedding + costs.head + d * costs.workspace + (d - 1) * costs.receive
        raise DeviceMemoryError(
            f"{d} card{'s' if d > 1 else ''} of {_size_list(budgets)} cannot hold the model's {size_text(total)} "
            f"on the device (weights, KV cache and expert slots by layer; the fullest card would need "
            f"{best[d - 1][n]:.0%} of its budget); lower -c or --cache-slots, or add a card")
    shares, hi = [], n
    for k in range(d - 1, -1, -1):
        lo = cut[k][hi] if k else 0
        shares.append(DeviceShare(devices[k], lo, hi - 1, used(k, lo, hi), budgets[k]))
        hi = lo
    return DevicePlan(tuple(reversed(shares)))


def _size_list(budgets: Sequence[int]) -> str:
    return "/".join(size_text(b) for b in sorted(set(budgets)))


def plan_costs(f: GGUFFile, cfg: ModelConfig, n_ctx: int, slots: int | None, workspace_bytes: int,
               receive_bytes: int = 0, kv_type: str = DEFAULT_KV_TYPE) -> PlanCosts:
    """The bytes each layer keeps on its card at context `n_ctx` with `slots` cache slots per MoE layer
    (None: every routed expert resident in its layer's weights), K/V cached as `kv_type`."""
    from runner.backends.kv_type import kv_value_bytes
    from runner.offload.sizing import recurrent_state_bytes

    weights, experts = [0] * cfg.n_layer, [0] * cfg.n_layer
    embedding = head = nextn_experts = 0
    for t in f.tensors.values():
        m = _BLOCK.match(t.name)
        if m is None:
            if t.name.startswith("token_embd."):
                embedding += t.nbytes
            else:
                head += t.nbytes
            continue
        i = int(m.group(1))
        if i >= cfg.n_layer:  # a NextN block runs after the trunk's head
            if is_routed_expert(t.name):
                nextn_experts += t.nbytes
            else:
                head += t.nbytes
        elif is_routed_expert(t.name):
            experts[i] += t.nbytes
        else:
            weights[i] += t.nbytes
    # the NextN block's experts sit behind slots of their own under offload, as a trunk layer's
    head += nextn_experts if slots is None else nextn_experts // max(cfg.n_expert, 1) * min(slots, cfg.n_expert)
    if "output.weight" not in f.tensors:
        head += f.tensors["token_embd.weight"].nbytes  # tied: the last card needs its own copy
    n_recurrent = sum(cfg.is_recurrent(i) for i in range(cfg.n_layer))
    state = recurrent_state_bytes(cfg) // n_recurrent if n_recurrent else 0  # its DEVICE_STATE_SETS copies
    kv_attention = 2 * n_ctx * cfg.n_head_kv * cfg.head_dim * kv_value_bytes(kv_type)
    layers = []
    for i in range(cfg.n_layer):
        kv = state if cfg.is_recurrent(i) else kv_attention
        if slots is None or not experts[i]:
            layers.append(LayerBytes(weights[i] + experts[i], kv, 0))
        else:
            per_expert = experts[i] // max(cfg.n_expert, 1)
            layers.append(LayerBytes(weights[i], kv, min(slots, cfg.n_expert) * per_expert))
    return PlanCosts(tuple(layers), embedding, head, workspace_bytes, receive_bytes)


@dataclass(frozen=True)
class SplitConfig:
    """A launch on two or more cards: their ids, each card's budget and the slots accounted per MoE layer."""

    devices: tuple[int, ...]
    budget_bytes: int  # every card's VRAM budget
    slots: int | None = None  # expert cache slots per MoE layer on its card; None: routed experts resident
    rows: int = 512  # the most hidden rows a forward moves across a boundary (the prompt micro-batch)
    kv_type: str = DEFAULT_KV_TYPE  # the K/V cache's element type (--cache-type)
    decode_batch: int = 1  # the largest verify batch: the decode graphs and their attention partials it holds

    def __post_init__(self) -> None:
        if len(self.devices) < 2:
            raise ProfileError(f"a split needs two or more devices, got {list(self.devices)}")
        if self.budget_bytes <= 0:
            raise DeviceMemoryError(f"the VRAM budget must be positive, got {self.budget_bytes} bytes")
        if self.rows < 1:
            raise ProfileError(f"a split moves at least one row, got rows={self.rows}")
        check_kv_type(self.kv_type, ProfileError)

    @property
    def receive_rows(self) -> int:
        """Rows of each card's receive buffer: a micro-batch, or a verify batch when that is more."""
        from runner.backends.limits import SMALL_BATCH_ROWS

        return max(self.rows, SMALL_BATCH_ROWS)

    def plan(self, f: GGUFFile, cfg: ModelConfig, n_ctx: int) -> tuple[DevicePlan, PlanCosts]:
        """The split of this model at context `n_ctx`, and the bytes it was made from."""
        from runner.offload.sizing import F32, decode_reservation_bytes

        receive = self.receive_rows * cfg.n_embd * F32
        costs = plan_costs(f, cfg, n_ctx, self.slots, decode_reservation_bytes(cfg, n_ctx, self.decode_batch), receive,
                           self.kv_type)
        return plan_devices(self.devices, [self.budget_bytes] * len(self.devices), costs), costs
