"""Which expert a full layer of slots evicts: LRU, and frequency with aging as the alternative."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Protocol

import numpy as np


class SlotPolicy(Protocol):
    """One per MoE layer; sees every use of a held expert and picks victims among the unprotected."""

    def touch(self, expert: int) -> None:
        """`expert` was used (a hit) or just filled into a slot."""
        ...

    def victim(self, protected: set[int]) -> int:
        """A held expert outside `protected` (the batch being served) to evict."""
        ...

    def forget(self, expert: int) -> None:
        ...


class LRU:
    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()  # least recent first

    def touch(self, expert: int) -> None:
        try:
            self._order.move_to_end(expert)  # a hit: the common case, one dict operation
        except KeyError:
            self._order[expert] = None

    def victim(self, protected: set[int]) -> int:
        return next(e for e in self._order if e not in protected)

    def forget(self, expert: int) -> None:
        self._order.pop(expert, None)


class AgingLFU:
    """Least frequently used, with every count halved each `period` uses so old popularity fades.

    Ties go to the least recently used. A new expert starts at one use, like a first hit. Counts and
    last uses are arrays over the layer's experts (0 for those not held), so a victim is a few array
    operations instead of a Python min over every held expert.
    """

    def __init__(self, period: int, n_expert: int):
        self.period = max(1, period)
        self._count = np.zeros(n_expert, dtype=np.float64)  # halved in place: the same floats a dict held
        self._last = np.zeros(n_expert, dtype=np.int64)  # clock of the last use; 0: not held
        self._clock = 0

    def touch(self, expert: int) -> None:
        self._clock += 1
        self._count[expert] += 1.0
        self._last[expert] = self._clock
        if self._clock % self.period == 0:
            self._count *= 0.5

    def victim(self, protected: set[int]) -> int:
        candidates = self._last > 0
        candidates[list(protected)] = False
        held = np.flatnonzero(candidates)
        counts = self._count[held]
        least = held[counts == counts.min()]
        return int(least[np.argmin(self._last[least])])  # last uses differ, so this is the one (count, last) minimum

    def forget(self, expert: int) -> None:
        self._count[expert] = 0.0
        self._last[expert] = 0


POLICIES: dict[str, Callable[[int, int], SlotPolicy]] = {  # (slots, experts in the layer) -> policy
    "lru": lambda slots, n_expert: LRU(),
    "lfu": lambda slots, n_expert: AgingLFU(4 * slots, n_expert),  # counts halve every four cache-fulls of uses
}
