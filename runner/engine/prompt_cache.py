"""A host-RAM prompt cache: several conversations' sequence states, so switching between them re-prefills
only what is new (llama-server's --cache-ram).

The engine keeps one sequence on the device. A request that leaves it (its prompt does not contain the
live sequence's last prompt: another conversation, an edited turn) first has the live state saved here,
keyed by its tokens; a request that shares a longer prefix with a saved entry than with the live
sequence gets that entry copied back. Entries are whole sequences: a newer entry that extends an older
one (the same conversation, further on) replaces it, and the least recently used go first when the
byte budget is exceeded.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from runner.engine.saved_state import SavedState
from runner.spec.drafter import SavedDrafter


@dataclass(frozen=True)
class Entry:
    tokens: np.ndarray  # int64 [n]: the sequence the states were computed from
    trunk: SavedState
    drafter: SavedDrafter | None  # the MTP drafter's, when the engine had one

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.trunk.nbytes + (self.drafter.nbytes if self.drafter else 0)

    def reuse(self, prompt: np.ndarray, limit: int) -> int:
        """Positions of `prompt` (at most `limit`) this entry restores."""
        return self.trunk.reachable(common_prefix(self.tokens, prompt, limit))

    def covers(self, other: "Entry") -> bool:
        """Whether this entry restores everything `other` would (so `other` is not worth keeping)."""
        n = len(other.tokens)
        return (n <= len(self.tokens) and common_prefix(self.tokens, other.tokens, n) == n
                and self.trunk.covers(other.trunk) and (other.drafter is None or self.drafter is not None))


@dataclass
class PromptCacheStats:
    saved: int = 0  # entries added
    restored: int = 0  # entries copied back to the device
    restored_tokens: int = 0
    evicted: int = 0  # dropped for the budget (least recently used first)
    too_large: int = 0  # live states not saved: larger than the whole budget


class PromptCache:
    """Entries by recency (least recently used first), within `budget_bytes` of host RAM."""

    def __init__(self, budget_bytes: int):
        if budget_bytes <= 0:
            raise ValueError(f"the prompt cache budget must be positive, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[int, Entry] = OrderedDict()
        self.nbytes = 0
        self.stats = PromptCacheStats()
        self._next_key = 0

    def __len__(self) -> int:
        return len(self.entries)

    def offer(self, nbytes: int, make: Callable[[], Entry]) -> None:
        """Save the entry `make` copies out, unless its size (`nbytes`, known before copying) exceeds the budget."""
        if nbytes > self.budget_bytes:
            self.stats.too_large += 1
            return
        self.add(make())

    def add(self, entry: Entry) -> None:
        """Keep `entry` as the most recently used, dropping the entries it covers, then the least recently
        used until the budget holds; an entry an existing one covers only refreshes that one."""
        if entry.nbytes > self.budget_bytes:
            self.stats.too_large += 1
            return
        for key, old in list(self.entries.items()):
            if old.covers(entry):
                self.entries.move_to_end(key)
                return
            if entry.covers(old):
                self._drop(key)
        self.entries[self._next_key] = entry
        self._next_key += 1
        self.nbytes += entry.nbytes
        self.stats.saved += 1
        while self.nbytes > self.budget_bytes:
            self._drop(next(iter(self.entries)))
            self.stats.evicted += 1

    def find(self, prompt: list[int], limit: int, need_drafter: bool = False) -> tuple[Entry | None, int]:
        """The entry that restores the most positions of `prompt` (at most `limit`), and how many.
        `need_drafter`: only entries that saved the MTP drafter."""
        tokens = np.asarray(prompt, dtype=np.int64)
        best, best_n = None, 0
        for entry in self.entries.values():
            if need_drafter and entry.drafter is None:
                continue
            n = entry.reuse(tokens, limit)
            if n > best_n:
                best, best_n = entry, n
        return best, best_n

    def restored(self, entry: Entry, n_tokens: int) -> None:
        """`entry` is being copied back (n_tokens of it): it becomes the most recently used."""
        self.entries.move_to_end(next(k for k, e in self.entries.items() if e is entry))
        self.stats.restored += 1
        self.stats.restored_tokens += n_tokens

    def _drop(self, key: int) -> None:
        self.nbytes -= self.entries.pop(key).nbytes


def common_prefix(a: np.ndarray, b: np.ndarray, limit: int) -> int:
    """The number of leading tokens a and b share, at most `limit`."""
    n = min(len(a), len(b), limit)
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
