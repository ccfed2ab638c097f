"""Single-token decode as one CUDA graph: captured once, replayed at every position.

What makes one graph valid for every position: the token id and the position are read from two
device buffers written before each replay; K/V rows are written at the device-side position; the
attention kernel reads the whole cache buffer and masks by position, so its launch does not depend
on how many tokens are cached. Everything else in a decode step is position-free. The first step
runs eagerly (it compiles kernels and fills CuPy's pool with the step's block sizes, on the graph's
stream, so the capture allocates nothing new); the second captures, and from then on each step is
two 8-byte uploads, one graph launch and the logits download.
"""

from __future__ import annotations

from typing import Any

import cupy as cp
import numpy as np

from runner.backends.step import Step
from runner.engine.kv_cache import KVCache


class DecodeGraph:
    def __init__(self, model: Any, kv: KVCache, experts: Any = None):
        assert experts is None, "a whole-token graph serves resident experts; offload uses SegmentedDecodeGraph"
        self.model = model
        self.kv = kv
        self.experts = None
        self.step_context = Step(graph=self)  # what the warm-up and the capture run under
        self.stream = cp.cuda.Stream(non_blocking=True)
        with self.stream:
            self.token = cp.zeros(1, dtype=cp.int64)
            self.position = cp.zeros(1, dtype=cp.int32)
        self._host_token = np.zeros(1, dtype=np.int64)
        self._host_position = np.zeros(1, dtype=np.int32)
        self.graph: Any = None
        self.outputs: tuple[cp.ndarray, cp.ndarray] | None = None
        self.warmed = False
        self.replays = 0
        self.gpu_times_ms: list[float] | None = None  # set to a list to record each replay's GPU time

    def step(self, token: int) -> tuple[cp.ndarray, cp.ndarray]:
        """Decode `token` at the cache's next position; (logits [1, vocab], hidden [1, n_embd])."""
        self.kv.positions(1)  # the capacity check, on the host as usual
        self._host_token[0] = token
        self._host_position[0] = self.kv.n_tokens
        with self.stream:
            self.token.set(self._host_token, stream=self.stream)
            self.position.set(self._host_position, stream=self.stream)
            if not self.warmed:
                outputs = self.model.forward(np.asarray([token]), self.kv, step=self.step_context)
                self.warmed = True
                self.stream.synchronize()
                return outputs
            if self.graph is None:
                self._capture()
            if self.gpu_times_ms is None:
                self.graph.launch(stream=self.stream)
            else:
                self._timed_launch()
        self.kv.advance(1)
        self.replays += 1
        self.stream.synchronize()
        assert self.outputs is not None
        return self.outputs

    def _timed_launch(self) -> None:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(self.stream)
        self.graph.launch(stream=self.stream)
        end.record(self.stream)
        end.synchronize()
        self.gpu_times_ms.append(cp.cuda.get_elapsed_time(start, end))

    def _capture(self) -> None:
        n_tokens = self.kv.n_tokens
        self.stream.begin_capture()
        try:
            self.outputs = self.model.forward(np.asarray([0]), self.kv, step=self.step_context)
        finally:
            self.graph = self.stream.end_capture()
            self.kv.truncate(n_tokens)  # the capture recorded kernels; it ran none, and advanced nothing
