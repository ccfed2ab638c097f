"""The slot cache against its reference: the dict-based bookkeeping and policies it had before its per-layer
address arrays, cached views and array LFU. Same counters, same slot for every expert, same victims, and
pair address tables that equal the addresses of the views fetch returns."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from runner.backends.budget import GIB, DeviceBudget
from runner.gguf_file import open_gguf
from runner.models.config import model_config
from runner.models.weights import load_weights
from runner.offload.device_arena import EmulatedDeviceArena
from runner.offload.host_store import HostExpertStore
from runner.offload.policies import POLICIES, AgingLFU
from runner.offload.provider import MATRICES, experts_by_recency
from runner.offload.slot_cache import ExpertSlotCache

SLOTS = 4


class ReferenceLRU:
    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def touch(self, expert: int) -> None:
        self._order[expert] = None
        self._order.move_to_end(expert)

    def victim(self, protected: set[int]) -> int:
        return next(e for e in self._order if e not in protected)

    def forget(self, expert: int) -> None:
        self._order.pop(expert, None)


class ReferenceLFU:
    """Aging LFU on dicts of the held experts, with a Python min over all of them per victim."""

    def __init__(self, period: int):
        self.period = max(1, period)
        self._count: dict[int, float] = {}
        self._last: dict[int, int] = {}
        self._clock = 0

    def touch(self, expert: int) -> None:
        self._clock += 1
        self._count[expert] = self._count.get(expert, 0.0) + 1.0
        self._last[expert] = self._clock
        if self._clock % self.period == 0:
            for e in self._count:
                self._count[e] *= 0.5

    def victim(self, protected: set[int]) -> int:
        return min((e for e in self._count if e not in protected), key=lambda e: (self._count[e], self._last[e]))

    def forget(self, expert: int) -> None:
        self._count.pop(expert, None)
        self._last.pop(expert, None)


class ReferenceLayer:
    """One layer's slots as the cache kept them: expert -> slot, a free list, and the counters."""

    def __init__(self, n_slots: int, policy: str):
        self.policy = ReferenceLRU() if policy == "lru" else ReferenceLFU(4 * n_slots)
        self.slot_of: dict[int, int] = {}
        self.free = list(range(n_slots - 1, -1, -1))
        self.hits = self.misses = self.evictions = 0

    def fetch(self, experts: list[int]) -> None:
        wanted = list(dict.fromkeys(experts))
        for e in reversed(wanted):
            if e in self.slot_of:
                self.hits += 1
            else:
                self.misses += 1
                if self.free:
                    slot = self.free.pop()
                else:
                    old = self.policy.victim(set(wanted))
                    slot = self.slot_of.pop(old)
                    self.policy.forget(old)
                    self.evictions += 1
                self.slot_of[e] = slot
            self.policy.touch(e)


@pytest.fixture(scope="module")
def store(synth_model) -> HostExpertStore:
    f = open_gguf(synth_model("glm4moe", "Q8_0"))
    return HostExpertStore(load_weights(f, model_config(f)))


def _routed(seed: int, steps: int, n_expert: int, k: int) -> list[np.ndarray]:
    """ids [T, k] per step, T of 1 or 2 (so at most SLOTS distinct experts), skewed toward low ids."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, n_expert + 1)
    p /= p.sum()
    return [np.array([rng.choice(n_expert, k, replace=False, p=p) for _ in range(rng.integers(1, 3))],
                     dtype=np.int32) for _ in range(steps)]


def _gate_slot(cache: ExpertSlotCache, layer: int, gate_address: int) -> int:
    """Which slot of `layer` a gate address points into (the layer's slots follow each other in the region)."""
    lay = cache._layers[layer]
    offset = gate_address - cache.arena.address(lay.region, lay.base) - cache.store.layout(layer).gate.offset
    assert offset % lay.expert_bytes == 0
    return offset // lay.expert_bytes


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_both_fetch_paths_keep_the_reference_counters_slots_and_addresses(store, policy: str) -> None:
    caches = [ExpertSlotCache(store, EmulatedDeviceArena(DeviceBudget(GIB)), SLOTS, policy) for _ in range(2)]
    by_views, by_table = caches
    refs = {i: ReferenceLayer(SLOTS, policy) for i in store.layers}
    for step, ids in enumerate(_routed(7, 300, store.n_expert(1), 2)):
        layer = store.layers[step % len(store.layers)]
        w = store.weights(layer)
        refs[layer].fetch(experts_by_recency(ids))
        got = by_views.fetch(w, experts_by_recency(ids))
        table = by_table.fetch_pair_addresses(w, ids, np.zeros((3, ids.size), dtype=np.uint64))
        ref = refs[layer]
        for cache in caches:
            c = cache.counters[layer]
            assert (c.hits, c.misses, c.evictions) == (ref.hits, ref.misses, ref.evictions)
            assert c.bytes_uploaded == ref.misses * store.expert_bytes(layer)
            assert cache.held(layer) == list(ref.slot_of)  # the same experts, filled in the same order
        for p, e in enumerate(ids.reshape(-1).tolist()):
            assert _gate_slot(by_table, layer, int(table[0, p])) == ref.slot_of[e]
            view = by_table.peek(layer, e)
            assert [int(table[r, p]) for r in range(3)] == [getattr(view, m).ctypes.data for m in MATRICES]
            assert _gate_slot(by_views, layer, got[e].gate.ctypes.data) == ref.slot_of[e]
            assert np.array_equal(got[e].down, store.matrices(layer, e).down)
    assert sum(r.evictions for r in refs.values()) > 100  # the stream really churned the slots


def test_a_refilled_slot_has_a_fresh_view_whose_key_names_the_new_upload(store) -> None:
    cache = ExpertSlotCache(store, EmulatedDeviceArena(DeviceBudget(GIB)), 1, "lru")
    w = store.weights(1)
    first = cache.fetch(w, [2])[2]
    assert cache.fetch(w, [2])[2] is first  # a hit builds nothing
    second = cache.fetch(w, [5])[5]  # evicts 2 into the same slot
    assert second.key != first.key and np.array_equal(second.gate, store.matrices(1, 5).gate)


@pytest.mark.parametrize("period,n_touches", [(16, 400), (1, 3000)])  # period 1: counts underflow to 0, ties
def test_aging_lfu_picks_the_reference_victims(period: int, n_touches: int) -> None:
    n_expert, held_most = 12, 6
    rng = np.random.default_rng(period)
    lfu, ref = AgingLFU(period, n_expert), ReferenceLFU(period)
    held: list[int] = []
    for _ in range(n_touches):
        e = int(rng.integers(n_expert)) if rng.random() < 0.3 else int(rng.choice(held or [0]))
        if e not in held and len(held) == held_most:
            protected = {e, *map(int, rng.choice(held, 2, replace=False))}
            old = ref.victim(protected)
            assert lfu.victim(protected) == old
            lfu.forget(old)
            ref.forget(old)
            held.remove(old)
        held = [x for x in held if x != e] + [e]
        lfu.touch(e)
        ref.touch(e)
    assert all(lfu._count[e] == ref._count[e] for e in held)  # bit for bit, halvings included


def test_every_policy_is_built_from_slots_and_experts() -> None:
    assert set(POLICIES) == {"lru", "lfu"}
    assert POLICIES["lfu"](3, 8).period == 12
