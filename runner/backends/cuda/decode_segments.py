"""A decode or verify batch under expert offload as a chain of CUDA graphs, split at each MoE layer's router.

One graph cannot hold such a step: which experts a layer needs is known only once its router has
run, and the slot cache decides on the host which of them to upload. So the step is cut into
segments. Segment 0 runs from the embedding to the first MoE layer's router. Then a host step reads
that layer's expert ids ([rows, k]), fetches the experts through the provider exactly as an eager
step does (misses upload on the arena's copy stream, which the graph stream then waits for; a batch
needs the slots an eager one does, and the cache refuses it the same way when they are too few) and
writes the gate, up and down address of each of the rows * k (token, expert) pairs into tables that
live as long as the graph. Segment 1 computes those experts from the tables and runs on to the next
router, and so on; the last segment ends with the head.

Capture happens while executing. The first step runs eagerly with the same host steps (it compiles
kernels and fills the pool on the graph stream, so the capture allocates nothing new; given a GraphPool,
that pool, so the graph outlives a prompt: graph_pool.py). The second
step ends the capture at each router, launches what it captured, runs the host step and begins the
next segment, so it computes its tokens too. Later steps replay. Token ids and positions come from
device buffers written before each step, as in DecodeGraph, which also says why one graph per row
count (1 for decode, 2..SMALL_BATCH_ROWS for an MTP verify batch) serves every position; between
segments nothing touches CuPy's pool.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from runner.backends.cuda.graph_batch import GraphBatch
from runner.backends.cuda.graph_pool import allocating
from runner.backends.step import Step
from runner.engine.kv_cache import KVCache
from runner.models.weights import MoEWeights
from runner.offload.provider import moe_layer_index

_H2D, _D2H = 1, 2  # cudaMemcpyKind


def _cupy() -> Any:
    import cupy

    return cupy


def _pinned(cp: Any, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    count = int(np.prod(shape))
    memory = cp.cuda.alloc_pinned_memory(count * np.dtype(dtype).itemsize)
    return np.frombuffer(memory, dtype=dtype, count=count).reshape(shape)


class LayerTables:
    """One MoE layer's buffers that outlive every step, for a batch of `rows` tokens of top-`k` experts: its
    ids on the host [rows, k], its pair address tables [3, rows * k] (pair t * k + j: token t's j-th
    expert) on the host (pinned, so the upload is a true async copy) and on the device (read by the
    segment after).

    The two copies per step are raw cudaMemcpyAsync calls on addresses taken once: CuPy's `.get(out=)`
    and `.set` cost 4 and 4-10 us more per call on the GPU box, twice per MoE layer and token."""

    def __init__(self, cp: Any, k: int, rows: int = 1, tail: np.ndarray | None = None):
        """`tail`: the shared expert's gate, up and down addresses, one more pair per row at the tables' end
        (CudaOps.fold_tail), written once; the host step rewrites only the routed pairs (`routed_host`)."""
        self.tail = tail
        width = rows * k + (rows if tail is not None else 0)
        self.ids_host = _pinned(cp, (rows, k), np.int32)
        self.table_host = _pinned(cp, (3, width), np.uint64)
        if tail is not None:
            self.table_host[:, rows * k :] = np.asarray(tail, dtype=np.uint64)[:, None]
        self.routed_host = self.table_host[:, : rows * k]
        self.table = cp.zeros((3, width), dtype=cp.uint64)
        self._memcpy = cp.cuda.runtime.memcpyAsync
        self._ids_host_at, self._table_host_at = self.ids_host.ctypes.data, self.table_host.ctypes.data
        self._table_at = self.table.data.ptr

    def download_ids(self, ids: Any, stream: Any) -> None:
        """ids (CuPy int32 [rows, k]) into ids_host; blocking, so this waits for the work before it on stream."""
        self._memcpy(self._ids_host_at, ids.data.ptr, self.ids_host.nbytes, _D2H, stream.ptr)
        stream.synchronize()

    def upload_table(self, stream: Any) -> None:
        """table_host to table, ordered on stream."""
        self._memcpy(self._table_at, self._table_host_at, self.table_host.nbytes, _H2D, stream.ptr)


@dataclass(frozen=True)
class HostStep:
    """The work between two segments: one MoE layer's expert ids in, its pair address tables out."""

    w: MoEWeights
    ids: Any  # CuPy int32 [rows, k] written by the segment before; held, since that graph writes its address
    tables: LayerTables

    def __post_init__(self) -> None:  # download_ids copies raw bytes: they must be the host buffer's
        if self.ids.dtype != np.int32 or self.ids.shape != self.tables.ids_host.shape or not self.ids.flags.c_contiguous:
            raise ValueError(f"expert ids {self.ids.dtype} {self.ids.shape} do not match the host buffer "
                             f"{self.tables.ids_host.dtype} {self.tables.ids_host.shape}")

    def run(self, experts: Any, stream: Any) -> None:
        self.read_ids(stream)
        self.fetch(experts, stream)

    def read_ids(self, stream: Any) -> None:
        """The ids to the host; blocking, so this waits for the segment before to finish."""
        self.tables.download_ids(self.ids, stream)

    def fetch(self, experts: Any, stream: Any) -> None:
        """The experts of the ids read, through the provider; their pair addresses to the device.

        `experts.fetch_pair_addresses` does what `fetch(w, experts_by_recency(ids))` does to the cache but
        writes the addresses straight into the table: no views are built for a step that only needs those.
        """
        t = self.tables
        experts.fetch_pair_addresses(self.w, t.ids_host, t.routed_host)
        # Safe to rewrite table_host at this layer's next host step: the blocking ids copies in between
        # drain the stream, this copy with it.
        t.upload_table(stream)


class SegmentedDecodeGraph:
    """DecodeGraph's interface (step, rows, token, position, kv, model, replays) for a model whose experts
    come from the provider `experts`; the MoE op calls `expert_pointers` at each router."""

    def __init__(self, model: Any, kv: KVCache, experts: Any, rows: int = 1, pool: Any = None):
        cp = _cupy()
        self.model = model
        self.kv = kv
        self.experts = experts
        self.pool = pool  # a GraphPool, or None: CuPy's default pool
        self.step_context = Step(experts=experts, graph=self)  # what the warm-up and the capture run under
        self.stream = cp.cuda.Stream(non_blocking=True)
        k = model.cfg.n_expert_used
        with self.stream:
            self.batch = GraphBatch(cp, rows)
            self.tables = {moe_layer_index(lw.ffn): LayerTables(cp, k, rows)
                           for lw in model.weights.layers if isinstance(lw.ffn, MoEWeights)}
        self.rows, self.token, self.position = self.batch.rows, self.batch.token, self.batch.position
        self.segments: list[Any] = []  # captured graphs, launched in order
        self.host_steps: list[HostStep] = []  # host_steps[i] runs after segments[i]
        self.outputs: tuple[Any, Any] | None = None
        self.warmed = False
        self.replays = 0
        self.ids_wait_s = 0.0  # replays' host steps: waiting for each segment and downloading its ids
        self.host_step_s = 0.0  # and the host work after that (fetch, enqueued uploads, tables)
        self._capturing = False  # this step captures segments
        self._open = False  # a capture is open on the stream now

    def step(self, tokens: Sequence[int]) -> tuple[Any, Any]:
        """Run `tokens` (`rows` of them) at the cache's next positions; (logits [rows, vocab], hidden
        [rows, n_embd]), buffers the next step overwrites."""
        with self.stream:  # fetch's uploads, fences and waits order themselves on the current stream
            self.batch.load(tokens, self.kv, self.stream)
            if self.segments:
                self._replay()
                outputs = self.outputs
            else:
                outputs = self._execute(np.asarray(tokens), capture=self.warmed)
                self.warmed = True
        self.stream.synchronize()
        assert outputs is not None
        return outputs

    @property
    def captured(self) -> bool:
        """The next step replays."""
        return bool(self.segments)

    def expert_pointers(self, w: MoEWeights, ids: Any, tail: np.ndarray | None = None) -> tuple[Any, Any, Any]:
        """The host step of MoE layer `w`, from inside the eager or capturing forward: the gate, up and
        down address rows the expert kernels are to read; with `tail`, one shared-expert pair per row after
        the routed ones (the tables are remade for it in the warm-up step, before any capture)."""
        layer = moe_layer_index(w)
        tables = self.tables[layer]
        if not same_tail(tables.tail, tail):
            assert not self._capturing, f"layer {layer}: the pair tables changed during a capture"
            with self.stream:
                tables = self.tables[layer] = LayerTables(_cupy(), tables.ids_host.shape[1], self.rows, tail)
        step = HostStep(w, ids, tables)
        if self._capturing:
            self._end_segment()  # launched now: the host step needs the ids it computes
        step.run(self.experts, self.stream)
        if self._capturing:
            self.host_steps.append(step)
            self._begin_segment()
        t = step.tables.table
        return t[0], t[1], t[2]

    def _execute(self, tokens: np.ndarray, capture: bool) -> tuple[Any, Any]:
        """model.forward on the graph stream: eagerly, or capturing the segments as it runs them."""
        n_tokens = self.kv.n_tokens
        self._capturing = capture
        try:
            if capture:
                self._begin_segment()
            # A verify batch needs every row's logits; decode only its one row's.
            with allocating(self.pool):
                outputs = self.model.forward(tokens, self.kv, all_logits=self.rows > 1, step=self.step_context)
            if capture:
                self._end_segment()
                self.outputs = outputs
            return outputs
        except BaseException:
            if self._open:  # the error is what the caller needs; a failed end of capture adds nothing
                with contextlib.suppress(Exception):
                    self.stream.end_capture()
                self._open = False
            self.segments, self.host_steps, self.outputs = [], [], None
            self.kv.truncate(n_tokens)  # forward advanced it only if it returned
            raise
        finally:
            self._capturing = False

    def _begin_segment(self) -> None:
        self.stream.begin_capture()
        self._open = True

    def _end_segment(self) -> None:
        graph = self.stream.end_capture()
        self._open = False
        self.segments.append(graph)
        graph.launch(stream=self.stream)

    def _replay(self) -> None:
        experts = self.experts
        for i, graph in enumerate(self.segments):
            graph.launch(stream=self.stream)
            if i < len(self.host_steps):
                step, t0 = self.host_steps[i], time.perf_counter()
                step.read_ids(self.stream)
                t1 = time.perf_counter()
                step.fetch(experts, self.stream)
                self.ids_wait_s += t1 - t0
                self.host_step_s += time.perf_counter() - t1
        self.kv.advance(self.rows)
        self.replays += 1


def same_tail(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Two pair tables' shared-expert tails are the same (both none, or the same addresses)."""
    return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))
