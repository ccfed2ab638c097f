"""N device slots per MoE layer, each holding one expert's gate, up and down in their GGUF types.

The cache is an ExpertProvider: fetch() serves held experts (hits) and uploads the others from the
host store into slots whose expert the batch does not need (misses, evicting by the layer's policy),
then makes compute wait for those uploads only. Slots are counted per layer (DESIGN.md), all of
them in a few budget reservations of consecutive layers (REGION_GROUPS): release() and restore() take
all of them, and a prompt's warm fill from staging may keep only the groups that fit beside its buffers
(reserve_for_fill), the other layers' warm experts then crossing from the host at restore().

Segmented decode runs fetch_pair_addresses once per MoE layer and token between CUDA graph segments,
so its host work is kept to the policy's touches on hits: each layer keeps its held experts' device
addresses in one array (a pair table is one gather) and each slot's matrices built once per fill.

A directory decode graph (runner/backends/cuda/token_graph.py) serves its steps on the device instead:
hand_to_device() gives every layer's bookkeeping to the device directories (DirectoryHandoff), and the
first host-side use after that (a fetch, a release, a count) takes it back, so the cache and the device
never both own it and each continues exactly where the other stopped (tests/test_directory_handoff.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Mapping, Protocol, Sequence

import numpy as np

from runner.errors import CacheError
from runner.models.weights import MoEWeights
from runner.offload.device_arena import DeviceArena, DeviceRegion
from runner.offload.host_store import ExpertLayout, HostExpertStore
from runner.offload.policies import POLICIES, Clocks, SlotPolicy
from runner.offload.provider import ExpertMatrices, experts_by_recency, moe_layer_index
from runner.offload.slot_directory import FREE, DirectoryCounters, DirectoryState

# The cache's device memory comes in this many reservations of consecutive layers (fewer for fewer layers):
# enough that a prompt with room for part of the cache keeps that part for its warm fill, few enough that a
# restore's allocations stay negligible beside its copies.
REGION_GROUPS = 8


@dataclass
class CacheCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    prefetched: int = 0  # experts filled a layer ahead for guessed ids (a directory graph's prefetch)
    bytes_uploaded: int = 0  # by misses and prefetches
    warm_fills: int = 0  # experts refilled by restore(warm) from the host store
    warm_bytes: int = 0
    warm_device_fills: int = 0  # experts filled from a prompt's staging buffer, device to device
    warm_device_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    def add(self, other: "CacheCounters") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def since(self, before: "CacheCounters") -> "CacheCounters":
        """What was counted between `before` (an earlier copy, e.g. total()) and now."""
        return CacheCounters(**{f.name: getattr(self, f.name) - getattr(before, f.name) for f in fields(self)})

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["hit_rate"] = self.hit_rate
        return d


@dataclass
class _Layer:
    region: DeviceRegion  # its group's reservation
    base: int  # offset of slot 0 in it
    n_slots: int
    expert_bytes: int
    policy: SlotPolicy
    slot_of: dict[int, int]  # expert -> slot
    free: list[int]
    slot_addresses: np.ndarray  # uint64 [3, n_slots]: device address of each slot's gate, up and down
    addresses: np.ndarray  # uint64 [3, n_expert]: the same per held expert (its slot's), 0 for the others
    host: np.ndarray  # the layer's experts in the host store, uint8 [n_expert * expert_bytes]
    host_address: int  # and its address, taken once: numpy's per upload cost ~3 us on the GPU box
    views: dict[int, ExpertMatrices] = field(default_factory=dict)  # slot -> its expert's matrices, until refilled


@dataclass(frozen=True)
class LayerGeometry:
    """Where a layer's slots and its experts in the host store are: what a device directory's fill reads."""

    slot0: int  # device address of slot 0
    expert_bytes: int
    offsets: tuple[int, int, int]  # gate, up and down in an expert
    host: int  # address of expert 0 in the (pinned) host store


class DirectoryHandoff(Protocol):
    """Device directories that serve decode steps between a hand_to_device() and the next host-side use."""

    def push(self, states: Mapping[int, tuple[DirectoryState, LayerGeometry]]) -> None:
        """Take every layer's state and geometry; the device's counters start at zero."""
        ...

    def pull(self) -> dict[int, tuple[DirectoryState, DirectoryCounters]]:
        """Every layer's state and what its counters counted since push, once the device work is done."""
        ...

    def counts(self) -> dict[int, DirectoryCounters]:
        """What each layer counted since push, read without taking anything back (another thread may be
        running a step: the figures are those of the last finished kernel)."""
        ...


def slot_addresses(first: int, n_slots: int, layout: ExpertLayout) -> np.ndarray:
    """uint64 [3, n_slots]: where gate, up and down of each of n_slots experts laid out from `first` start."""
    starts = np.uint64(first) + np.arange(n_slots, dtype=np.uint64) * np.uint64(layout.expert_bytes)
    return np.stack([starts + np.uint64(m.offset) for m in (layout.gate, layout.up, layout.down)])


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
        layers = list(store.layers)
        n = min(REGION_GROUPS, len(layers))
        self.groups: list[list[int]] = [layers[len(layers) * g // n : len(layers) * (g + 1) // n] for g in range(n)]
        self.regions: dict[int, DeviceRegion] = {}  # group -> its reservation, while reserved
        self._layers: dict[int, _Layer] = {}
        self._filled: dict[int, list[int]] = {}  # layer -> experts fill_from_staging placed, first most recent
        self._filling = False  # reserved by reserve_for_fill: restore() takes the slots as they are
        self._device: DirectoryHandoff | None = None  # owns the bookkeeping while set (hand_to_device)
        self.reserve()

    # -- memory -----------------------------------------------------------------------------------
    def layer_slots(self, layer: int) -> int:
        return min(self.slots_per_layer, self.store.n_expert(layer))

    def _layer_bytes(self, layer: int) -> int:
        return self.layer_slots(layer) * self.store.expert_bytes(layer)

    @property
    def nbytes(self) -> int:
        return sum(self._layer_bytes(i) for i in self.store.layers)

    def group_bytes(self, group: int) -> int:
        return sum(self._layer_bytes(i) for i in self.groups[group])

    def groups_bytes(self, groups: Sequence[int]) -> int:
        return sum(self.group_bytes(g) for g in groups)

    @property
    def reserved(self) -> bool:
        """Some slots are reserved: all of them, or (reserve_for_fill) the groups a prompt's warm fill kept."""
        return bool(self.regions)

    def has_slots(self, layer: int) -> bool:
        return layer in self._layers

    @property
    def held_slots(self) -> int:
        """Slots per layer reserved now: the configured count, or 0 while any layer's are released."""
        return self.slots_per_layer if len(self.regions) == len(self.groups) else 0

    def reserve(self, groups: Sequence[int] | None = None) -> None:
        """Reserve the slots of `groups` of layers (default: all), empty."""
        if self.regions:
            raise CacheError("the expert cache is already reserved")
        self._layers, self._filled = {}, {}
        self._reserve_groups(range(len(self.groups)) if groups is None else groups)

    def _reserve_groups(self, groups: Sequence[int]) -> None:
        """Reserve each group's slots, empty; all or none of them."""
        try:
            for g in groups:
                first, last = self.groups[g][0], self.groups[g][-1]
                region = self.arena.reserve(f"expert cache ({self.slots_per_layer} slots per layer), layers "
                                            f"{first} to {last}", self.group_bytes(g))
                self.regions[g] = region
                base = 0
                for i in self.groups[g]:
                    self._layers[i] = self._empty_layer(i, region, base)
                    base += self._layer_bytes(i)
        except BaseException:
            for g in groups:
                self._free_group(g)
            raise

    def _free_group(self, group: int) -> None:
        region = self.regions.pop(group, None)
        if region is not None:
            self.arena.free(region)
        for i in self.groups[group]:
            self._layers.pop(i, None)

    def _empty_layer(self, i: int, region: DeviceRegion, base: int) -> _Layer:
        n, eb, n_expert = self.layer_slots(i), self.store.expert_bytes(i), self.store.n_expert(i)
        host = self.store.layer_range(i)
        return _Layer(region, base, n, eb, POLICIES[self.policy](n, n_expert), {}, list(range(n - 1, -1, -1)),
                      slot_addresses(self.arena.address(region, base), n, self.store.layout(i)),
                      np.zeros((3, n_expert), dtype=np.uint64), host, host.ctypes.data)

    def release(self) -> None:
        """Free every slot and give the reservations back (the held experts are forgotten)."""
        self._take_back()  # its counts
        if not self.regions:
            raise CacheError("the expert cache is already released")
        for g in list(self.regions):
            self._free_group(g)
        self._layers, self._filled, self._filling = {}, {}, False

    def reserve_for_fill(self, groups: Sequence[int] | None = None) -> None:
        """Reserve the slots of `groups` (default: all) empty while a prompt streams, for fill_from_staging;
        restore() completes them and reserves the others."""
        self.reserve(groups)
        self._filling = True

    def restore(self, warm: Mapping[int, Sequence[int]] | None = None) -> None:
        """Reserve the slots again; refill each layer with `warm[layer]` (first ones first, up to its slots).

        Slots still reserved (a prompt filled some layers from staging, fill_from_staging) are kept for the
        layers whose fill is exactly the warm list; every other layer is emptied and uploaded from the host,
        so the result is the same as restoring from a released cache."""
        self._take_back()
        if not self.regions:
            self.reserve()
        elif not self._filling:
            raise CacheError("the expert cache is already reserved")
        else:
            self._reserve_groups([g for g in range(len(self.groups)) if g not in self.regions])
        warm = warm or {}
        for layer in self.store.layers:
            lay = self._layers[layer]
            experts = list(dict.fromkeys(warm.get(layer, [])))[: lay.n_slots]
            if lay.slot_of and self._filled.get(layer) == experts:
                continue
            if lay.slot_of:
                lay = self._layers[layer] = self._empty_layer(layer, lay.region, lay.base)
            for e in experts[::-1]:  # the first listed ends most recent
                self._upload(layer, lay, e, lay.free.pop())
                self.counters[layer].warm_fills += 1
                self.counters[layer].warm_bytes += lay.expert_bytes
        self._filled, self._filling = {}, False

    def fill_from_staging(self, layer: int, experts: Sequence[int], staging: DeviceRegion) -> None:
        """Fill an empty layer of the reserved cache with `experts` (first listed most recent, up to its slots),
        copied device to device from `staging`, which holds the layer's whole set (expert e at e * expert_bytes).
        restore() keeps the fill when the warm list it is given is the same."""
        self._take_back()
        lay = self._live(layer)
        if not self._filling or lay.slot_of:
            raise CacheError(f"layer {layer}: fill from staging outside a prompt's fill, or into slots holding experts")
        chosen = list(dict.fromkeys(int(e) for e in experts))[: lay.n_slots]
        eb, dst, src = lay.expert_bytes, [], []
        for e in chosen[::-1]:
            slot = lay.free.pop()
            dst.append(lay.base + slot * eb)
            src.append(e * eb)
            self._place(lay, e, slot)
        self.arena.copy_experts(lay.region, dst, staging, src, eb)
        self._filled[layer] = chosen
        self.counters[layer].warm_device_fills += len(chosen)
        self.counters[layer].warm_device_bytes += len(chosen) * eb

    # -- lookups ----------------------------------------------------------------------------------
    def holds(self, layer: int, expert: int) -> bool:
        self._take_back()
        return layer in self._layers and expert in self._layers[layer].slot_of

    def held(self, layer: int) -> list[int]:
        self._take_back()
        return list(self._layers[layer].slot_of) if layer in self._layers else []

    def peek(self, layer: int, expert: int) -> ExpertMatrices:
        """A held expert's matrices, counting nothing and changing no recency (prefill skips)."""
        self._take_back()
        lay = self._live(layer)
        return self._slot_view(layer, lay, lay.slot_of[expert])

    def fetch(self, w: MoEWeights, experts: Sequence[int]) -> Mapping[int, ExpertMatrices]:
        self._take_back()
        layer = moe_layer_index(w)
        lay = self._live(layer)
        wanted = list(dict.fromkeys(int(e) for e in experts))
        self._serve(layer, lay, wanted)
        return {e: self._slot_view(layer, lay, lay.slot_of[e]) for e in wanted}

    def fetch_pair_addresses(self, w: MoEWeights, ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        """fetch(w, experts_by_recency(ids)) without building views: the same hits, misses, evictions and
        uploads; out uint64 [3, T * k] gets the gate, up and down device address of each pair of ids [T, k]
        (pair t * k + j is token t's j-th expert), the addresses fetch's views have."""
        self._take_back()
        layer = moe_layer_index(w)
        lay = self._live(layer)
        pairs = np.asarray(ids).reshape(-1)
        order = pairs[::-1].tolist()  # oldest first, as _serve touches them
        if ids.shape[0] == 1 and len(set(order)) == len(order) and all(e in lay.slot_of for e in order):
            # One token's distinct experts (a router's top-k), every one held: _serve would only count hits
            # and touch them in this order; doing just that skips its per-expert bookkeeping.
            self.counters[layer].hits += len(order)
            touch = lay.policy.touch
            for e in order:
                touch(e)
        else:
            self._serve(layer, lay, experts_by_recency(ids))
        return lay.addresses.take(pairs, axis=1, out=out)

    def total(self) -> CacheCounters:
        out = CacheCounters()
        for c in self.layer_counters().values():
            out.add(c)
        return out

    # -- the device directories' turn ---------------------------------------------------------------
    @property
    def on_device(self) -> bool:
        return self._device is not None

    def layer_counters(self) -> dict[int, CacheCounters]:
        """Per layer counters with what the device directories counted since the handoff, as copies. Counting
        takes nothing back: the server reads them from another thread while the worker's decode steps run."""
        out = {i: CacheCounters() for i in self.counters}
        for i, c in self.counters.items():
            out[i].add(c)
        device = self._device
        if device is not None:
            for layer, counts in device.counts().items():
                self._add_device_counts(out[layer], layer, counts)
        return out

    def _add_device_counts(self, c: CacheCounters, layer: int, counts: DirectoryCounters) -> None:
        """A device directory's hits, misses, evictions and prefetches; each miss or prefetch uploaded one expert."""
        c.hits, c.misses, c.evictions = c.hits + counts.hits, c.misses + counts.misses, c.evictions + counts.evictions
        c.prefetched += counts.prefetched
        c.bytes_uploaded += (counts.misses + counts.prefetched) * self.store.expert_bytes(layer)

    def hand_to_device(self, device: DirectoryHandoff) -> None:
        """Give every layer's bookkeeping to `device` until the next host-side use (a no-op while it has it)."""
        if self._device is device:
            return
        self._take_back()
        if len(self.regions) < len(self.groups):
            raise CacheError("the expert cache is released (a prefill phase holds its memory, or one failed)")
        device.push({i: (self.export_layer(i), self.geometry(i)) for i in self.store.layers})
        self._device = device

    def _take_back(self) -> None:
        if self._device is None:
            return
        device, self._device = self._device, None
        try:
            for layer, (state, counts) in device.pull().items():
                self.import_layer(layer, state, counts)
        except BaseException:
            # The device's fills have overwritten slots the host's bookkeeping still names: with no state to
            # continue from, no layer may keep its experts (a stale one would serve another expert's bytes).
            for i, lay in self._layers.items():
                self._layers[i] = self._empty_layer(i, lay.region, lay.base)
            raise

    def geometry(self, layer: int) -> LayerGeometry:
        lay = self._live(layer)
        m = self.store.layout(layer)
        return LayerGeometry(self.arena.address(lay.region, lay.base), lay.expert_bytes,
                             (m.gate.offset, m.up.offset, m.down.offset), lay.host_address)

    def export_layer(self, layer: int) -> DirectoryState:
        """A layer's bookkeeping in a device directory's terms (runner/offload/slot_directory.py)."""
        lay = self._live(layer)
        n, filled = lay.n_slots, lay.n_slots - len(lay.free)
        if lay.free != list(range(n - 1, filled - 1, -1)):  # fills pop free slots in ascending order
            raise CacheError(f"layer {layer}: free slots {lay.free} are not the last ones; a directory cannot take them")
        state = DirectoryState(np.full(self.store.n_expert(layer), FREE, dtype=np.int32),
                               np.full(n, FREE, dtype=np.int32), np.zeros(n, dtype=np.int64),
                               np.zeros(n, dtype=np.float64), 0, filled)
        clocks = lay.policy.clocks()
        for e, slot in lay.slot_of.items():
            state.slot_of[e], state.expert_of[slot] = slot, e
            state.last[slot], state.count[slot] = clocks.last[e], clocks.count[e]
        state.clock = clocks.clock
        state.check()
        return state

    def import_layer(self, layer: int, state: DirectoryState, counts: DirectoryCounters) -> None:
        """Continue from a device directory's `state` of `layer`, adding what it counted."""
        state.check()
        lay = self._live(layer)
        expert_of = state.expert_of.tolist()
        held = {e: s for s, e in enumerate(expert_of) if e != FREE}
        for slot in [s for s in lay.views if expert_of[s] == FREE or lay.slot_of.get(expert_of[s]) != s]:
            lay.views.pop(slot)  # refilled on the device: the emulated arena's view names the upload it shows
        lay.slot_of = held
        lay.free = list(range(lay.n_slots - 1, state.filled - 1, -1))
        lay.addresses[:] = 0
        for e, slot in held.items():
            lay.addresses[:, e] = lay.slot_addresses[:, slot]
        lay.policy.load_clocks(Clocks({e: int(state.last[s]) for e, s in held.items()},
                                      {e: float(state.count[s]) for e, s in held.items()}, state.clock))
        self._add_device_counts(self.counters[layer], layer, counts)

    # -- internals --------------------------------------------------------------------------------
    def _serve(self, layer: int, lay: _Layer, wanted: list[int]) -> None:
        """Touch the held experts of `wanted` and upload the others into free or evicted slots (never one
        holding an expert of `wanted`), oldest first; compute then waits for those uploads."""
        if len(wanted) > lay.n_slots:
            raise CacheError(
                f"layer {layer}: one batch routed to {len(wanted)} distinct experts but the cache has "
                f"{lay.n_slots} slots per layer; use more --cache-slots or smaller batches"
            )
        c, slot_of, touch = self.counters[layer], lay.slot_of, lay.policy.touch
        protected: set[int] | None = None  # built at the first eviction: most steps evict nothing
        uploaded, hits = False, 0
        for e in reversed(wanted):  # oldest first, so the last token's experts end most recent
            if e in slot_of:
                hits += 1
                touch(e)
                continue
            c.misses += 1
            if lay.free:
                slot = lay.free.pop()
            else:
                protected = set(wanted) if protected is None else protected
                slot = self._evict(lay, lay.policy.victim(protected))
                c.evictions += 1
            self._upload(layer, lay, e, slot)
            c.bytes_uploaded += lay.expert_bytes
            uploaded = True
        c.hits += hits
        if uploaded:
            self.arena.wait_uploads()

    def _evict(self, lay: _Layer, expert: int) -> int:
        """Forget a held expert; its slot, now free to refill."""
        slot = lay.slot_of.pop(expert)
        lay.policy.forget(expert)
        lay.addresses[:, expert] = 0
        return slot

    def _live(self, layer: int) -> _Layer:
        lay = self._layers.get(layer)
        if lay is None:
            raise CacheError("the expert cache is released (a prefill phase holds its memory, or one failed)")
        return lay

    def _upload(self, layer: int, lay: _Layer, expert: int, slot: int) -> None:
        eb = lay.expert_bytes
        start = expert * eb  # store.experts(layer, expert), without its lookups
        self.arena.upload(lay.region, lay.base + slot * eb, lay.host[start : start + eb], lay.host_address + start)
        self._place(lay, expert, slot)

    def _place(self, lay: _Layer, expert: int, slot: int) -> None:
        """The bookkeeping of `expert` now in `slot`."""
        lay.slot_of[expert] = slot
        lay.addresses[:, expert] = lay.slot_addresses[:, slot]
        lay.views.pop(slot, None)  # the emulated arena's view names the upload it shows
        lay.policy.touch(expert)

    def _slot_view(self, layer: int, lay: _Layer, slot: int) -> ExpertMatrices:
        """The matrices in `slot`, built at the first use after its fill (CuPy slicing costs microseconds)."""
        view = lay.views.get(slot)
        if view is None:
            view = lay.views[slot] = self._view(layer, lay, slot)
        return view

    def _view(self, layer: int, lay: _Layer, slot: int) -> ExpertMatrices:
        return self.arena.view(lay.region, lay.base + slot * lay.expert_bytes, self.store.layout(layer))
