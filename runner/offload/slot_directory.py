"""One MoE layer's expert -> slot directory as flat arrays: the state a device kernel would own (issue 20).

The slot cache keeps its bookkeeping in Python dicts and policy objects on the host, which is why
decode stops at every router to read the ids. A device-side directory holds the same facts in arrays
indexed by expert and by slot, and serves a batch's ids with a loop a single thread block can run:
no dict, no ordered list, only per-slot clocks (LRU) or per-slot counts and clocks (aging LFU).

This is the numpy twin of that kernel, written in the kernel's terms (slots filled in ascending order,
victims by an argmin over slots), and held to ExpertSlotCache's hits, misses, victims and slot choices
on the same id sequence (tests/test_slot_directory.py). The CUDA kernel (cuda/slot_directory.cu) is held to
this twin on the GPU. `DirectoryState` is what passes between the slot cache and a device directory when
decode hands the cache's bookkeeping to the device and back (ExpertSlotCache.export_layer / import_layer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from runner.errors import CacheError
from runner.offload.provider import experts_by_recency

FREE = -1


@dataclass
class DirectoryCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    prefetched: int = 0  # experts filled for guesses a layer ahead (prefetch), not for a batch


@dataclass
class DirectoryState:
    """One layer's directory in the kernel's terms (SlotDirectory's arrays and its two scalars)."""

    slot_of: np.ndarray  # int32 [n_expert]
    expert_of: np.ndarray  # int32 [n_slots]
    last: np.ndarray  # int64 [n_slots]
    count: np.ndarray  # float64 [n_slots]
    clock: int
    filled: int

    def check(self) -> None:
        """slot_of and expert_of name each other, and exactly the first `filled` slots hold experts."""
        held = np.flatnonzero(self.slot_of != FREE)
        if (len(held) != self.filled or not np.all(self.expert_of[: self.filled] >= 0)
                or np.any(self.expert_of[self.filled:] != FREE)
                or not np.array_equal(self.expert_of[self.slot_of[held]], held)):
            raise CacheError("an expert directory's slot_of and expert_of disagree (device state corrupted)")


@dataclass
class SlotDirectory:
    n_expert: int
    n_slots: int
    policy: str = "lru"  # "lru" or "lfu" (aging: counts halve every `period` touches, as policies.AgingLFU)
    period: int = 0  # lfu only; 0: four cache-fulls of uses, POLICIES["lfu"]'s choice
    slot_of: np.ndarray = field(init=False)  # int32 [n_expert]: its slot, FREE if not held
    expert_of: np.ndarray = field(init=False)  # int32 [n_slots]: its expert, FREE if never filled
    last: np.ndarray = field(init=False)  # int64 [n_slots]: clock of the slot's last touch
    count: np.ndarray = field(init=False)  # float64 [n_slots]: lfu's aged use count
    clock: int = 0
    filled: int = 0  # slots fill in ascending order, so the free ones are filled..n_slots-1
    counters: DirectoryCounters = field(default_factory=DirectoryCounters)

    def __post_init__(self) -> None:
        if self.policy not in ("lru", "lfu"):
            raise CacheError(f"unknown cache policy '{self.policy}'; choose from lru, lfu")
        self.period = self.period or 4 * self.n_slots
        self.slot_of = np.full(self.n_expert, FREE, dtype=np.int32)
        self.expert_of = np.full(self.n_slots, FREE, dtype=np.int32)
        self.last = np.zeros(self.n_slots, dtype=np.int64)
        self.count = np.zeros(self.n_slots, dtype=np.float64)

    def state(self) -> DirectoryState:
        return DirectoryState(self.slot_of.copy(), self.expert_of.copy(), self.last.copy(), self.count.copy(),
                              self.clock, self.filled)

    def load(self, state: DirectoryState) -> None:
        """Continue from `state` (a slot cache's export_layer), with fresh counters."""
        state.check()
        self.slot_of, self.expert_of = state.slot_of.copy(), state.expert_of.copy()
        self.last, self.count = state.last.copy(), state.count.copy()
        self.clock, self.filled, self.counters = state.clock, state.filled, DirectoryCounters()

    def serve(self, ids: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """The slot of every pair of ids [T, k] (int32 [T * k]) and the fills to make, (expert, slot) in order:
        held experts are touched, the others take a free slot or evict one no expert of the batch holds."""
        fills = self._walk(ids, prefetch=False)
        return self.slot_of[np.asarray(ids).reshape(-1)], fills

    def prefetch(self, guesses: np.ndarray) -> list[tuple[int, int]]:
        """Claim slots for guesses [T, d] at a batch to come (a layer ahead), as serve() would for that batch: the
        fills to make. They count as prefetched, not as misses, and the held guesses count no hits."""
        return self._walk(guesses, prefetch=True)

    def _walk(self, ids: np.ndarray, prefetch: bool) -> list[tuple[int, int]]:
        wanted = experts_by_recency(ids)
        if len(wanted) > self.n_slots:
            raise CacheError(f"one batch routed to {len(wanted)} distinct experts but the directory has "
                             f"{self.n_slots} slots")
        protected = np.zeros(self.n_expert, dtype=bool)
        protected[wanted] = True
        fills = []
        for e in reversed(wanted):  # oldest first, so the last token's experts end most recent
            slot = int(self.slot_of[e])
            if slot != FREE:
                if not prefetch:
                    self.counters.hits += 1
            else:
                if prefetch:
                    self.counters.prefetched += 1
                else:
                    self.counters.misses += 1
                slot = self._free_or_victim(protected)
                self.slot_of[e], self.expert_of[slot] = slot, e
                self.count[slot] = 0.0
                fills.append((e, slot))
            self._touch(slot)
        return fills

    def _touch(self, slot: int) -> None:
        self.clock += 1
        self.last[slot] = self.clock
        if self.policy == "lfu":
            self.count[slot] += 1.0
            if self.clock % self.period == 0:
                self.count[: self.filled] *= 0.5

    def _free_or_victim(self, protected: np.ndarray) -> int:
        if self.filled < self.n_slots:
            self.filled += 1
            return self.filled - 1
        candidates = ~protected[self.expert_of]
        if self.policy == "lru":
            key = np.where(candidates, self.last, np.iinfo(np.int64).max)
            slot = int(np.argmin(key))
        else:  # least count, then least recent: the (count, last) minimum, as AgingLFU.victim
            least = np.where(candidates, self.count, np.inf)
            tied = candidates & (self.count == least.min())
            slot = int(np.argmin(np.where(tied, self.last, np.iinfo(np.int64).max)))
        self.slot_of[self.expert_of[slot]] = FREE
        self.counters.evictions += 1
        return slot
