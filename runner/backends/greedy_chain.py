"""Greedy decode steps queued ahead of the host: the step that chooses token t + 1 runs while the host handles t.

Plain greedy decoding chooses each token on the backend (Ops.greedy_token), so the next step's input need not
visit the host: a chain enqueues step t + 1 reading the token step t chose where it chose it, and only then
waits for step t's choice. What the host does a token (the generation loop, detokenizing, stop strings, the next
step's uploads and launches) then overlaps the GPU's step instead of following it. `submit` enqueues; `take`
waits for the oldest step not yet taken. The tokens are plain greedy decoding's, step for step.

SyncGreedyChain runs each step when it is submitted: the numpy backend's chain, and CUDA's where no whole-step
graph serves (segmented offload graphs, eager steps). CUDA's DeviceGreedyChain (backends/cuda/greedy_chain.py)
enqueues without waiting.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol


class GreedyChain(Protocol):
    def submit(self, token: int | None) -> None:
        """Enqueue a decode step of one token at the cache's next position: `token`, or (None) the token the
        previous submitted step chose, read where it was chosen."""

    def take(self) -> int | None:
        """Wait for the oldest step not yet taken: its choice (the argmax of its logits), or None when its logits
        held a NaN or an infinity."""


class SyncGreedyChain:
    """A chain that runs each step at submit: ops.decode_forward, then ops.greedy_token."""

    def __init__(self, ops: Any, model: Any, kv: Any, step: Any):
        self.ops, self.model, self.kv, self.step = ops, model, kv, step
        self._chosen: deque[int | None] = deque()
        self._last: int | None = None  # the last submitted step's choice: the next None step's input

    def submit(self, token: int | None) -> None:
        if token is None:  # a step after non-finite logits reads index 0, as greedy.cu leaves it on the device
            token = self._last if self._last is not None else 0
        logits, _ = self.ops.decode_forward(self.model, token, self.kv, self.step)
        self._last = self.ops.greedy_token(logits[-1])
        self._chosen.append(self._last)

    def take(self) -> int | None:
        return self._chosen.popleft()
