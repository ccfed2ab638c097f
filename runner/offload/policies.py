"""Which expert a full layer of slots evicts: LRU, and frequency with aging as the alternative."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
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

    def clocks(self) -> Clocks:
        """Each held expert's last use and count, and the clock: the state a device directory continues from."""
        ...

    def load_clocks(self, clocks: Clocks) -> None:
        """Continue from what a device directory left (clocks() of the same policy, moved on)."""
        ...


@dataclass
class Clocks:
    last: dict[int, int]  # held expert -> clock of its last use (distinct, so they order the experts)
    count: dict[int, float]  # held expert -> aged use count (LFU; 0 for LRU)
    clock: int


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

    def clocks(self) -> Clocks:  # LRU keeps no clock: ranks order the experts as well
        return Clocks({e: i + 1 for i, e in enumerate(self._order)}, dict.fromkeys(self._order, 0.0), len(self._order))

    def load_clocks(self, clocks: Clocks) -> None:
        self._order = OrderedDict((e, None) for e in sorted(clocks.last, key=clocks.last.__getitem__))


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

    def clocks(self) -> Clocks:
        held = np.flatnonzero(self._last > 0).tolist()
        return Clocks({e: int(self._last[e]) for e in held}, {e: float(self._count[e]) for e in held}, self._clock)

    def load_clocks(self, clocks: Clocks) -> None:
        self._count[:], self._last[:] = 0.0, 0
        for e, last in clocks.last.items():
            self._last[e], self._count[e] = last, clocks.count[e]
        self._clock = clocks.clock


POLICIES: dict[str, Callable[[int, int], SlotPolicy]] = {  # (slots, experts in the layer) -> policy
    "lru": lambda slots, n_expert: LRU(),
    "lfu": lambda slots, n_expert: AgingLFU(4 * slots, n_expert),  # counts halve every four cache-fulls of uses
}
