"""The per-layer expert slot cache: hits, misses, eviction policies, release/restore, and slot sizing."""

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
from runner.offload.sizing import parse_cache_slots, resolve_cache_slots
from runner.offload.slot_cache import ExpertSlotCache


@pytest.fixture(scope="module")
def store(synth_model) -> HostExpertStore:
    f = open_gguf(synth_model("glm4moe", "Q8_0"))
    return HostExpertStore(load_weights(f, model_config(f)))


def _cache(store, slots, policy="lru", budget=GIB):
    arena = EmulatedDeviceArena(DeviceBudget(budget))
    return ExpertSlotCache(store, arena, slots, policy), arena


def _fetch(cache, store, layer, experts):
    return cache.fetch(store.weights(layer), experts)


def test_slots_hold_exactly_the_host_bytes_of_their_expert(store) -> None:
    cache, _ = _cache(store, 3)
    for experts in ([1, 2], [5], [2, 7], [0, 3, 6]):
        got = _fetch(cache, store, 1, experts)
        for e, m in got.items():
            host = store.matrices(1, e)
            assert all(np.array_equal(getattr(m, k), getattr(host, k)) for k in ("gate", "up", "down"))


def test_lru_counts_hits_misses_evictions_and_bytes_per_layer(store) -> None:
    cache, arena = _cache(store, 3)
    for experts in ([1, 2], [1, 3], [4], [1, 2], [2, 1]):  # 4 evicts 2; then 2 misses and evicts 3
        _fetch(cache, store, 1, experts)
    _fetch(cache, store, 2, [0])
    c = cache.counters[1]
    assert (c.hits, c.misses, c.evictions) == (4, 5, 2)
    assert c.bytes_uploaded == 5 * store.expert_bytes(1)
    assert sorted(cache.held(1)) == [1, 2, 4]
    total = cache.total()
    assert (total.hits, total.misses) == (4, 6)
    assert arena.bytes_uploaded == total.bytes_uploaded


def test_uploads_name_the_host_address_of_the_bytes_they_copy(store) -> None:
    """The cache hands the arena each expert's host address (numpy's costs microseconds per miss); the
    emulated arena checks it against the bytes, so a wrong offset fails every cache test, not a GPU run."""
    cache, arena = _cache(store, 3)
    _fetch(cache, store, 1, [4, 1])  # two misses: both addresses checked
    assert arena.uploads == 2
    host = store.experts(1, 4)
    region = arena.reserve("scratch", host.nbytes)
    with pytest.raises(ValueError, match="host address"):
        arena.upload(region, 0, host, host.ctypes.data + 1)


def test_a_batch_never_evicts_its_own_experts(store) -> None:
    cache, _ = _cache(store, 2)
    _fetch(cache, store, 1, [0, 1])
    got = _fetch(cache, store, 1, [1, 2])  # 0 is the only eviction candidate
    assert set(got) == {1, 2} and sorted(cache.held(1)) == [1, 2]


def test_a_batch_wider_than_the_slots_is_a_clear_error(store) -> None:
    cache, _ = _cache(store, 2)
    with pytest.raises(CacheError, match="layer 1: one batch routed to 3 distinct experts but the cache has 2 slots"):
        _fetch(cache, store, 1, [0, 1, 2])


def test_aging_lfu_keeps_a_frequent_expert_that_lru_evicts(store) -> None:
    pattern = [[0], [0], [0], [1], [2], [0]]  # 0 is hot, then two one-off experts pass through 2 slots
    results = {}
    for policy in ("lru", "lfu"):
        cache, _ = _cache(store, 2, policy)
        for experts in pattern:
            _fetch(cache, store, 1, experts)
        results[policy] = cache.counters[1].hits
    assert results == {"lru": 2, "lfu": 3}


def test_release_gives_the_budget_back_and_restore_refills_warm(store) -> None:
    cache, arena = _cache(store, 3)
    budget = arena.budget
    held = budget.used_bytes
    assert held == cache.nbytes == 3 * sum(store.expert_bytes(i) for i in store.layers)
    _fetch(cache, store, 1, [4])
    cache.release()
    assert budget.used_bytes == 0 and cache.held_slots == 0
    with pytest.raises(CacheError, match="released"):
        _fetch(cache, store, 1, [4])
    cache.restore({1: [6, 5, 7, 0], 2: [3]})  # layer 1 keeps the first three
    assert budget.used_bytes == held and cache.held_slots == 3
    assert sorted(cache.held(1)) == [5, 6, 7] and cache.held(2) == [3] and cache.held(3) == []
    assert cache.counters[1].warm_fills == 3 and cache.counters[1].warm_bytes == 3 * store.expert_bytes(1)
    _fetch(cache, store, 1, [1])  # LRU: 7, the last listed, goes first
    assert sorted(cache.held(1)) == [1, 5, 6]
    assert cache.counters[1].hits == 0


def test_a_released_slot_is_poisoned_so_a_stale_view_shows(store) -> None:
    cache, _ = _cache(store, 1)
    m = _fetch(cache, store, 1, [2])[2]
    cache.release()
    assert (m.gate == 0xFF).all()


def test_cache_slots_auto_fills_what_the_budget_leaves_less_its_headroom(store) -> None:
    per_slot = sum(store.expert_bytes(i) for i in store.layers)
    budget = DeviceBudget(100 * per_slot)
    budget.reserve("resident weights", 93 * per_slot + 7)
    # 7 slots' bytes less 7 are free; 2% of the budget (2 slots' bytes) stays free for what the ledger
    # does not itemize, so 4 fit, where an explicit count may take 6.
    assert resolve_cache_slots("auto", budget, store, least=2) == 4
    assert resolve_cache_slots(6, budget, store, least=2) == 6
    assert resolve_cache_slots("auto", DeviceBudget(GIB), store, least=2) == 8  # never more than the experts


def test_too_many_slots_is_a_start_up_error_naming_the_numbers(store) -> None:
    per_slot = sum(store.expert_bytes(i) for i in store.layers)
    budget = DeviceBudget(10 * per_slot)
    budget.reserve("kv cache", 6 * per_slot)
    with pytest.raises(CacheError, match=r"--cache-slots 5 needs .* \(5 slots x 3 MoE layers.*held: kv cache .*at most 4 slots per layer fit"):
        resolve_cache_slots(5, budget, store, least=2)
    with pytest.raises(CacheError, match="fewer than the 2 distinct experts"):
        resolve_cache_slots(1, budget, store, least=2)
    with pytest.raises(CacheError, match="a decode batch needs 5"):
        resolve_cache_slots("auto", budget, store, least=5)


def test_parse_cache_slots() -> None:
    assert parse_cache_slots("150") == 150 and parse_cache_slots("auto") == "auto" and parse_cache_slots(3) == 3
    for bad in ("0", "-3", "many"):
        with pytest.raises(CacheError):
            parse_cache_slots(bad)


def test_upload_versions_name_the_newest_upload_of_any_byte_range() -> None:
    from runner.offload.device_arena import UploadVersions

    rng = np.random.default_rng(0)
    for _ in range(50):
        versions, newest = UploadVersions(), np.zeros(100, dtype=int)
        for upload in range(1, 25):
            a = int(rng.integers(0, 100))
            b = int(rng.integers(a + 1, 101))
            versions.write(a, b, upload)
            newest[a:b] = upload
            for _ in range(5):
                a = int(rng.integers(0, 100))
                b = int(rng.integers(a + 1, 101))
                assert versions.latest(a, b) == newest[a:b].max()
