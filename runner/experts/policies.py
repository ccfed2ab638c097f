"""Which expert a full layer of slots evicts: LRU, and frequency with aging as the alternative."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Protocol


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
        self._order[expert] = None
        self._order.move_to_end(expert)

    def victim(self, protected: set[int]) -> int:
        return next(e for e in self._order if e not in protected)

    def forget(self, expert: int) -> None:
        self._order.pop(expert, None)


class AgingLFU:
    """Least frequently used, with every count halved each `period` uses so old popularity fades.

    Ties go to the least recently used. A new expert starts at one use, like a first hit.
    """

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


POLICIES: dict[str, Callable[[int], SlotPolicy]] = {
    "lru": lambda slots: LRU(),
    "lfu": lambda slots: AgingLFU(period=4 * slots),  # counts halve every four cache-fulls of uses
}
