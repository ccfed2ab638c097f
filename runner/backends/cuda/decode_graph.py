"""A decode or verify batch of a fixed number of rows as one CUDA graph: captured once, replayed at every
position.

`rows` is 1 for decode and 2..SMALL_BATCH_ROWS for an MTP verify batch (the pending token and its
drafts); each row count gets its own graph. What makes one graph valid for every position: the token
ids and the positions are read from two device buffers ([rows] each) written before each replay; K/V
rows are written at the device-side positions; the attention kernel reads the whole cache buffer and
masks each row by its own position, so its launch does not depend on how many tokens are cached, and
its rows' bits do not depend on the other rows (cuda/attention.cu). Everything else in the step is
position-free, and batch-invariant at these sizes (GEMV), so a replayed verify row gives the bits of
an eager one. The first step runs eagerly (it compiles kernels and fills the pool with the step's
block sizes, on the graph's stream, so the capture allocates nothing new); the second captures, and
from then on each step is two small uploads, one graph launch and the logits download. Given a
GraphPool (graph_pool.py), the warm-up and the capture allocate there, where a prompt cannot free the
temporaries the graph replays into, so the graph outlives the prefill phase transaction.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

import numpy as np

from runner.backends.cuda.graph_batch import GraphBatch
from runner.backends.cuda.graph_pool import allocating
from runner.backends.step import Step
from runner.engine.kv_cache import KVCache


def _cupy() -> Any:  # imported on use, so the CPU tests can stand in for it
    import cupy

    return cupy


def _pinned_zeros(cp: Any) -> Any:
    """Page-locked host arrays for the graph's uploads where `cp` is CuPy (a stand-in gets numpy's)."""
    if getattr(cp, "__name__", None) != "cupy":
        return np.zeros
    import cupyx

    return cupyx.zeros_pinned


class DecodeGraph:
    serves_experts = False  # resident experts only; offload takes SegmentedDecodeGraph or DirectoryDecodeGraph

    def __init__(self, model: Any, kv: KVCache, experts: Any = None, rows: int = 1, pool: Any = None):
        assert (experts is not None) == self.serves_experts, "a whole-step graph of resident experts got a provider"
        self.cp = cp = _cupy()
        self.model = model
        self.kv = kv
        self.experts = experts
        self.pool = pool  # a GraphPool, or None: CuPy's default pool
        self.step_context = Step(experts=experts, graph=self)  # what the warm-up and the capture run under
        self.stream = cp.cuda.Stream(non_blocking=True)
        with self.stream:
            self.batch = GraphBatch(cp, rows, _pinned_zeros(cp))
        self.rows, self.token, self.position = self.batch.rows, self.batch.token, self.batch.position
        self.graph: Any = None
        self.outputs: tuple[Any, Any] | None = None
        self.warmed = False
        self.replays = 0
        self.gpu_times_ms: list[float] | None = None  # set to a list to record each replay's GPU time
        self._timing: deque[tuple[Any, Any]] = deque()  # timed replays' (start, end) events not yet collected

    def step(self, tokens: Sequence[int]) -> tuple[Any, Any]:
        """Run `tokens` (`rows` of them) at the cache's next positions; (logits [rows, vocab], hidden
        [rows, n_embd]), buffers the next step overwrites."""
        outputs = self.enqueue(tokens)
        self.stream.synchronize()
        self.collect_times()
        return outputs

    def enqueue(self, tokens: Sequence[int] | None) -> tuple[Any, Any]:
        """step() without waiting once the graph replays: the step is on self.stream when this returns. tokens
        None: the ids already in the token buffer (a greedy chain's device-side choice; not the warm-up). The
        warm-up and capture steps still finish before it returns."""
        with self.stream:
            if tokens is None:
                assert self.warmed, "the eager warm-up step embeds host token ids"
                self.batch.load_positions(self.kv, self.stream)
            else:
                self.batch.load(tokens, self.kv, self.stream)
            if not self.warmed:
                outputs = self._forward(np.asarray(tokens))
                self.warmed = True
                self.stream.synchronize()
                return outputs
            if self.graph is None:
                self._capture()
            if self.gpu_times_ms is None:
                self.graph.launch(stream=self.stream)
            else:
                self._timed_launch()
        self.kv.advance(self.rows)
        self.replays += 1
        assert self.outputs is not None
        return self.outputs

    @property
    def captured(self) -> bool:
        """The next step replays."""
        return self.graph is not None

    def _forward(self, tokens: np.ndarray) -> tuple[Any, Any]:
        # A verify batch needs every row's logits; decode only its one row's.
        with allocating(self.pool):
            return self.model.forward(tokens, self.kv, all_logits=self.rows > 1, step=self.step_context)

    def _timed_launch(self) -> None:
        cp = self.cp
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(self.stream)
        self.graph.launch(stream=self.stream)
        end.record(self.stream)
        self._timing.append((start, end))

    def collect_times(self) -> None:
        """Move the GPU times of the finished timed replays into gpu_times_ms, oldest first (a replay still
        running, and those after it, stay pending; with timing switched off since, they are dropped)."""
        while self._timing and self._timing[0][1].done:
            start, end = self._timing.popleft()
            if self.gpu_times_ms is not None:
                self.gpu_times_ms.append(self.cp.cuda.get_elapsed_time(start, end))

    def _capture(self) -> None:
        n_tokens = self.kv.n_tokens
        self.stream.begin_capture()
        try:
            self.outputs = self._forward(np.zeros(self.rows, dtype=np.int64))
        finally:
            self.graph = self.stream.end_capture()
            self.kv.truncate(n_tokens)  # the capture recorded kernels; it ran none, and advanced nothing
