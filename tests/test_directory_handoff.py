"""The slot cache handing its bookkeeping to device directories and taking it back (hand_to_device), on the
CPU with the directories' numpy twin: a cache that serves some batches itself, hands the next ones to the
twin and takes the rest back makes every choice a cache that served them all makes (the same slots for
every pair, the same counters, the same state at the end), under LRU and aging LFU. The kernel is held to
the twin on the GPU (tests/test_slot_directory_cuda.py)."""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.budget import GIB, DeviceBudget
from runner.errors import CacheError
from runner.gguf_file import open_gguf
from runner.models.config import model_config
from runner.models.weights import load_weights
from runner.offload.device_arena import EmulatedDeviceArena
from runner.offload.host_store import HostExpertStore
from runner.offload.policies import POLICIES
from runner.offload.slot_cache import ExpertSlotCache, LayerGeometry
from runner.offload.slot_directory import DirectoryCounters, DirectoryState, SlotDirectory


@pytest.fixture(scope="module")
def store(synth_model) -> HostExpertStore:
    f = open_gguf(synth_model("glm4moe", "Q8_0"))
    return HostExpertStore(load_weights(f, model_config(f)))


class TwinDirectories:
    """DirectoryHandoff on the numpy twin: what DeviceDirectories does with kernels."""

    def __init__(self, store: HostExpertStore, slots: int, policy: str):
        self.twins = {i: SlotDirectory(store.n_expert(i), min(slots, store.n_expert(i)), policy,
                                       getattr(POLICIES[policy](slots, store.n_expert(i)), "period", 0))
                      for i in store.layers}
        self.geometry: dict[int, LayerGeometry] = {}
        self.pushes = self.pulls = 0

    def push(self, states) -> None:
        for layer, (state, geo) in states.items():
            self.twins[layer].load(state)
            self.geometry[layer] = geo
        self.pushes += 1

    def pull(self) -> dict[int, tuple[DirectoryState, DirectoryCounters]]:
        self.pulls += 1
        return {i: (t.state(), t.counters) for i, t in self.twins.items()}

    def counts(self) -> dict[int, DirectoryCounters]:
        return {i: DirectoryCounters(t.counters.hits, t.counters.misses, t.counters.evictions)
                for i, t in self.twins.items()}

    def addresses(self, layer: int, ids: np.ndarray) -> np.ndarray:
        """What the kernel writes into the pair table: each pair's gate, up and down address."""
        slots, _fills = self.twins[layer].serve(ids)
        geo = self.geometry[layer]
        at = np.uint64(geo.slot0) + slots.astype(np.uint64) * np.uint64(geo.expert_bytes)
        return np.stack([at + np.uint64(o) for o in geo.offsets])


def _batches(rng: np.random.Generator, n_expert: int, k: int, n: int) -> list[np.ndarray]:
    p = np.arange(1, n_expert + 1, dtype=float) ** -1.1
    p /= p.sum()
    return [np.stack([rng.choice(n_expert, size=k, replace=False, p=p) for _ in range(rng.integers(1, 4))])
            .astype(np.int32) for _ in range(n)]


def _cache(store: HostExpertStore, slots: int, policy: str) -> ExpertSlotCache:
    return ExpertSlotCache(store, EmulatedDeviceArena(DeviceBudget(GIB)), slots, policy)


def _host_addresses(cache: ExpertSlotCache, store: HostExpertStore, layer: int, ids: np.ndarray) -> np.ndarray:
    out = np.zeros((3, ids.size), dtype=np.uint64)
    return cache.fetch_pair_addresses(store.weights(layer), ids, out)


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_a_cache_and_the_device_taking_turns_choose_what_the_cache_alone_chooses(store, policy: str) -> None:
    slots, k = 6, 2
    layers = store.layers[:2]
    rng = np.random.default_rng(3)
    turns = []  # host, device, host, device, host: each a decode-like walk over the layers
    for _ in range(5):
        per_layer = [_batches(rng, store.n_expert(layer), k, 60) for layer in layers]
        turns.append([(layer, ids) for step in zip(*per_layer) for layer, ids in zip(layers, step)])
    alone, taking_turns = _cache(store, slots, policy), _cache(store, slots, policy)
    device = TwinDirectories(store, slots, policy)
    for n, turn in enumerate(turns):
        for layer, ids in turn:
            want = _host_addresses(alone, store, layer, ids)
            if n % 2:
                taking_turns.hand_to_device(device)  # a no-op after the first of the turn
                got = device.addresses(layer, ids)
            else:
                got = _host_addresses(taking_turns, store, layer, ids)
            # the caches' slots sit at the same offsets of their own regions: compare offsets
            base_w, base_g = (c.geometry(layer).slot0 if not c.on_device else device.geometry[layer].slot0
                              for c in (alone, taking_turns))
            assert (got - np.uint64(base_g)).tolist() == (want - np.uint64(base_w)).tolist()
    assert device.pushes == 2 and device.pulls == 2 and not taking_turns.on_device
    for layer in layers:
        assert alone.layer_counters()[layer] == taking_turns.layer_counters()[layer]
        a, b = alone.export_layer(layer), taking_turns.export_layer(layer)
        for name in ("slot_of", "expert_of", "last", "count"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert (a.clock, a.filled) == (b.clock, b.filled)
    assert alone.total().evictions > 100  # the victim choice ran on both sides of every handoff


def test_any_host_side_use_takes_the_bookkeeping_back(store) -> None:
    cache, layer = _cache(store, 4, "lru"), store.layers[0]
    device = TwinDirectories(store, 4, "lru")
    cache.hand_to_device(device)
    device.addresses(layer, np.array([[1, 2]], dtype=np.int32))
    counted = cache.layer_counters()[layer]  # counting reads the device's counts and takes nothing back
    assert cache.on_device and counted.misses == 2 and counted.bytes_uploaded == 2 * store.expert_bytes(layer)
    assert cache.total().misses == 2 and cache.counters[layer].misses == 0 and cache.on_device
    assert cache.holds(layer, 1) and not cache.on_device
    assert cache.counters[layer].misses == 2 and cache.counters[layer].bytes_uploaded == 2 * store.expert_bytes(layer)
    cache.hand_to_device(device)
    device.addresses(layer, np.array([[1, 3]], dtype=np.int32))
    cache.release()  # takes the counts back before the slots go
    assert not cache.on_device and cache.total().misses == 3 and cache.total().hits == 1
    with pytest.raises(CacheError, match="released"):
        cache.hand_to_device(device)


def test_a_corrupted_device_state_is_refused_and_no_layer_keeps_stale_experts(store) -> None:
    """The device may have refilled any slot since the handoff: a take-back that fails (here the last layer's
    state, after the others were taken back) leaves every layer empty, not serving slots it no longer knows."""
    cache, layer = _cache(store, 4, "lru"), store.layers[-1]
    device = TwinDirectories(store, 4, "lru")
    for i in store.layers:
        _host_addresses(cache, store, i, np.array([[1, 2]], dtype=np.int32))
    cache.hand_to_device(device)
    device.twins[layer].expert_of[0] = 3  # slot 0 claims an expert slot_of does not place there
    with pytest.raises(CacheError, match="disagree"):
        cache.held(layer)
    assert not cache.on_device and all(cache.held(i) == [] for i in store.layers)
    assert all(cache.export_layer(i).filled == 0 for i in store.layers)
    misses = cache.total().misses
    _host_addresses(cache, store, store.layers[0], np.array([[1, 2]], dtype=np.int32))
    assert cache.total().misses == misses + 2  # uploaded again


def test_directory_graphs_are_chosen_only_where_a_backend_has_directories(synth_model) -> None:
    """numpy has no graphs and no device directories: --decode-graph directory leaves it on segments (said in
    stats); an unknown kind is refused in one line."""
    from runner.engine.engine import Engine, EngineConfig
    from runner.offload.offload import OffloadConfig

    cfg = OffloadConfig(cache_slots=3, decode_graph="directory")
    engine = Engine.load(synth_model("glm4moe", "Q8_0"), EngineConfig(n_ctx=64, ubatch=8, offload=cfg))
    assert engine.offload.decode_graph == "segments"
    assert engine.stats()["decode_graph"] == {"kind": "segments", "handoffs": 0}
    with pytest.raises(CacheError, match="decode_graph must be segments or directory, got 'token'"):
        OffloadConfig(decode_graph="token")  # type: ignore[arg-type]
