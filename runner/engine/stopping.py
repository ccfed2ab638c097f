"""Stop strings over streamed text: hold back any tail that could still become a stop string."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def push(self, text: str) -> str:
        """Add decoded text; return what is safe to emit. Sets `stopped` when a stop string appears."""
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending, self.stopped = self.pending[: min(hits)], "", True
            return out
        hold = max((partial_suffix(self.pending, s) for s in self.stops), default=0)
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def partial_suffix(text: str, stop: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of stop."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-n:]):
            return n
    return 0
