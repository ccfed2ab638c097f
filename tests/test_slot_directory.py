"""The device directory's numpy twin against the slot cache: same hits, misses, evictions and slot for every
pair on the same id sequences, under LRU and aging LFU, for decode tokens and verify batches."""

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
from runner.offload.slot_cache import ExpertSlotCache
from runner.offload.slot_directory import SlotDirectory


@pytest.fixture(scope="module")
def store(synth_model) -> HostExpertStore:
    f = open_gguf(synth_model("glm4moe", "Q8_0"))
    return HostExpertStore(load_weights(f, model_config(f)))


def _batches(rng: np.random.Generator, n_expert: int, k: int, n: int, skew: float) -> list[np.ndarray]:
    """n batches of 1 to 3 tokens, k distinct experts each, drawn with a skewed popularity (so experts recur)."""
    p = np.arange(1, n_expert + 1, dtype=float) ** -skew
    p /= p.sum()
    return [np.stack([rng.choice(n_expert, size=k, replace=False, p=p) for _ in range(rng.integers(1, 4))])
            for _ in range(n)]


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("skew", [0.0, 1.2])
def test_the_directory_makes_the_slot_caches_choices(store, policy: str, skew: float) -> None:
    layer = store.layers[0]
    n_expert, k, slots = store.n_expert(layer), 2, 6  # any router width: the cache takes the ids it is given
    cache = ExpertSlotCache(store, EmulatedDeviceArena(DeviceBudget(GIB)), slots, policy)
    directory = SlotDirectory(n_expert, slots, policy)
    slot_addresses = cache._layers[layer].slot_addresses[0]
    w = store.weights(layer)
    for ids in _batches(np.random.default_rng(7), n_expert, k, 300, skew):
        out = np.zeros((3, ids.size), dtype=np.uint64)
        cache.fetch_pair_addresses(w, ids.astype(np.int32), out)
        want_slots = np.searchsorted(slot_addresses, out[0])
        got_slots, fills = directory.serve(ids)
        assert got_slots.tolist() == want_slots.tolist()
        assert len(fills) == len({int(e) for e, _ in fills})
    c = cache.counters[layer]
    assert (directory.counters.hits, directory.counters.misses, directory.counters.evictions) == (
        c.hits, c.misses, c.evictions)
    assert c.evictions > 50  # the sequence exercised the victim choice, not only free slots


def test_a_batch_wider_than_the_slots_is_refused() -> None:
    with pytest.raises(CacheError, match="3 distinct experts"):
        SlotDirectory(8, 2).serve(np.array([[0, 1, 2]]))
