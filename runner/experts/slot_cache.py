"""N device slots per MoE layer, each holding one expert's gate, up and down in their GGUF types.

The cache is an ExpertProvider: fetch() serves held experts (hits) and uploads the others from the
host store into slots whose expert the batch does not need (misses, evicting by the layer's policy),
then makes compute wait for those uploads only. Slots are counted per layer (DESIGN.md), all of
them in one budget reservation, so release() and restore() are all or nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping, Sequence

from ..errors import CacheError
from ..weights import MoEWeights
from .device_arena import DeviceArena, DeviceRegion
from .host_store import HostExpertStore
from .policies import POLICIES, SlotPolicy
from .provider import ExpertMatrices, moe_layer_index


@dataclass
class CacheCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes_uploaded: int = 0  # by misses
    warm_fills: int = 0  # experts refilled by restore(warm)
    warm_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    def add(self, other: "CacheCounters") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["hit_rate"] = self.hit_rate
        return d


@dataclass
class _Layer:
    base: int  # offset of slot 0 in the cache region
    n_slots: int
    expert_bytes: int
    policy: SlotPolicy
    slot_of: dict[int, int]  # expert -> slot
    free: list[int]


class ExpertSlotCache:
    def __init__(self, store: HostExpertStore, arena: DeviceArena, slots_per_layer: int, policy: str = "lru"):
        if policy not in POLICIES:
            raise CacheError(f"unknown cache policy '{policy}'; choose from {', '.join(POLICIES)}")
        if slots_per_layer < 1:
            raise CacheError(f"--cache-slots must be at least 1 per layer, got {slots_per_layer}")
        self.store = store
        self.arena = arena
        self.slots_per_layer = slots_per_layer  # as configured; a layer with fewer experts holds them all
        self.policy = policy
        self.counters = {i: CacheCounters() for i in store.layers}
        self.region: DeviceRegion | None = None
        self._layers: dict[int, _Layer] = {}
        self.reserve()

    # -- memory -----------------------------------------------------------------------------------
    def layer_slots(self, layer: int) -> int:
        return min(self.slots_per_layer, self.store.n_expert(layer))

    @property
    def nbytes(self) -> int:
        return sum(self.layer_slots(i) * self.store.expert_bytes(i) for i in self.store.layers)

    @property
    def reserved(self) -> bool:
        return self.region is not None

    @property
    def held_slots(self) -> int:
        """Slots per layer reserved now: the configured count, or 0 while released."""
        return self.slots_per_layer if self.reserved else 0

    def reserve(self) -> None:
        if self.region is not None:
            raise CacheError("the expert cache is already reserved")
        self.region = self.arena.reserve(f"expert cache ({self.slots_per_layer} slots per layer)", self.nbytes)
        base = 0
        self._layers = {}
        for i in self.store.layers:
            n, eb = self.layer_slots(i), self.store.expert_bytes(i)
            self._layers[i] = _Layer(base, n, eb, POLICIES[self.policy](n), {}, list(range(n - 1, -1, -1)))
            base += n * eb

    def release(self) -> None:
        """Free every slot and give the reservation back (the held experts are forgotten)."""
        if self.region is None:
            raise CacheError("the expert cache is already released")
        self.arena.free(self.region)
        self.region = None
        self._layers = {}

    def restore(self, warm: Mapping[int, Sequence[int]] | None = None) -> None:
        """Reserve the slots again; refill each layer with `warm[layer]` (first ones first, up to its slots)."""
        self.reserve()
        for layer, experts in (warm or {}).items():
            lay = self._layers[layer]
            for e in list(dict.fromkeys(experts))[: lay.n_slots][::-1]:  # the first listed ends most recent
                self._upload(layer, lay, e, lay.free.pop())
                self.counters[layer].warm_fills += 1
                self.counters[layer].warm_bytes += lay.expert_bytes

    # -- lookups ----------------------------------------------------------------------------------
    def holds(self, layer: int, expert: int) -> bool:
        return self.region is not None and expert in self._layers[layer].slot_of

    def held(self, layer: int) -> list[int]:
        return [] if self.region is None else list(self._layers[layer].slot_of)

    def peek(self, layer: int, expert: int) -> ExpertMatrices:
        """A held expert's matrices, counting nothing and changing no recency (prefill skips)."""
        lay = self._live(layer)
        return self._view(layer, lay, lay.slot_of[expert])

    def fetch(self, w: MoEWeights, experts: Sequence[int]) -> Mapping[int, ExpertMatrices]:
        layer = moe_layer_index(w)
        lay = self._live(layer)
        wanted = list(dict.fromkeys(int(e) for e in experts))
        if len(wanted) > lay.n_slots:
            raise CacheError(
                f"layer {layer}: one batch routed to {len(wanted)} distinct experts but the cache has "
                f"{lay.n_slots} slots per layer; use more --cache-slots or smaller batches"
            )
        c, protected, uploaded = self.counters[layer], set(wanted), False
        for e in reversed(wanted):  # oldest first, so the last token's experts end most recent
            if e in lay.slot_of:
                c.hits += 1
                lay.policy.touch(e)
            else:
                c.misses += 1
                if lay.free:
                    slot = lay.free.pop()
                else:
                    old = lay.policy.victim(protected)
                    slot = lay.slot_of.pop(old)
                    lay.policy.forget(old)
                    c.evictions += 1
                self._upload(layer, lay, e, slot)
                c.bytes_uploaded += lay.expert_bytes
                uploaded = True
        if uploaded:
            self.arena.wait(self.arena.fence())
        return {e: self._view(layer, lay, lay.slot_of[e]) for e in wanted}

    def total(self) -> CacheCounters:
        out = CacheCounters()
        for c in self.counters.values():
            out.add(c)
        return out

    # -- internals --------------------------------------------------------------------------------
    def _live(self, layer: int) -> _Layer:
        if self.region is None:
            raise CacheError("the expert cache is released (a prefill phase holds its memory, or one failed)")
        return self._layers[layer]

    def _upload(self, layer: int, lay: _Layer, expert: int, slot: int) -> None:
        assert self.region is not None
        self.arena.upload(self.region, lay.base + slot * lay.expert_bytes, self.store.experts(layer, expert))
        lay.slot_of[expert] = slot
        lay.policy.touch(expert)

    def _view(self, layer: int, lay: _Layer, slot: int) -> ExpertMatrices:
        assert self.region is not None
        return self.arena.view(self.region, lay.base + slot * lay.expert_bytes, self.store.layout(layer))
