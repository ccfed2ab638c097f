"""CUDA's greedy chain (backends/greedy_chain.py): decode steps replayed from the whole-step graph one behind the
other on its stream, each followed by cuda/greedy.cu writing its choice into the graph's token buffer, where the
next replay reads its input, and into a pinned slot the host reads when it takes the step. A submit uploads the
step's position (and a host token, if given), launches the graph and the choice, and records an event; nothing
waits until `take`. The chosen ids never round-trip through the host between steps.

Two slots alternate (a slot's step is taken before the step two later is submitted: chained_greedy_tokens keeps
at most two in flight). The graph's first two steps (warm-up, capture) run through DecodeGraph.enqueue, which
finishes them before it returns; a warm-up needs its token on the host, so a None submit before it reads the
previous step's choice first.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import cupy as cp
import cupyx
import numpy as np

from runner.backends.cuda.greedy import launch_greedy


class DeviceGreedyChain:
    def __init__(self, graph_of: Any):
        """`graph_of()`: the decode graph of one row serving the chain's cache now (a DecodeGraph: one launch a
        step), made or remade as decode_forward would."""
        self.graph_of = graph_of
        self._chosen = cp.zeros((2, 2), dtype=cp.int32)  # a slot's (argmax, finite), on the device
        self._host = cupyx.zeros_pinned((2, 2), dtype=np.int32)  # and where the host reads it
        self._pending: deque[tuple[Any, int, Any]] = deque()  # (event after the step, slot, graph), oldest first
        self._submitted = 0

    def submit(self, token: int | None) -> None:
        graph = self.graph_of()
        if token is None and not graph.warmed:  # an eager warm-up step embeds a host token
            token = self._newest_choice()
        slot = self._submitted % 2
        logits, _ = graph.enqueue(None if token is None else [token])
        with graph.stream:
            launch_greedy(logits.reshape(-1), self._chosen[slot], graph.batch.token[:1])
            cp.cuda.runtime.memcpyAsync(self._host[slot].ctypes.data, self._chosen[slot].data.ptr, 8,
                                        cp.cuda.runtime.memcpyDeviceToHost, graph.stream.ptr)
            done = cp.cuda.Event(disable_timing=True)
            done.record(graph.stream)
        self._pending.append((done, slot, graph))
        self._submitted += 1

    def take(self) -> int | None:
        done, slot, graph = self._pending.popleft()
        done.synchronize()
        graph.collect_times()  # the step's replay time, when the replays are timed
        index, finite = (int(v) for v in self._host[slot])
        return index if finite else None

    def _newest_choice(self) -> int:
        """The last submitted step's choice, waited for (0 after non-finite logits, as the device leaves it)."""
        assert self._pending, "a step on the previous choice needs a previous step"
        done, slot, _ = self._pending[-1]
        done.synchronize()
        return int(self._host[slot][0])
