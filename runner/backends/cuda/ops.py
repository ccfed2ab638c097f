"""The CUDA backend: NumpyOps' methods on CuPy arrays, each one a few RawKernel launches from cuda/.

Small batches (decode and speculative verify, at most SMALL_BATCH_ROWS rows) run the batch-invariant
quantized GEMV kernels, so a row's result never depends on the rows beside it; larger batches
(prefill) dequantize each weight to fp16 and run one cuBLAS GEMM. All math is float32 otherwise,
like NumpyOps with its default float32 activations, which is the twin this backend is tested against.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import cupy as cp
import numpy as np

from runner.backends.budget import DeviceBudget
from runner.backends.cuda import attention as attention_cuda
from runner.backends.cuda import delta_net as delta_net_cuda
from runner.backends.cuda import gemv as gemv_cuda
from runner.backends.cuda import greedy as greedy_cuda
from runner.backends.cuda import last_block_counters
from runner.backends.cuda import norm_rope as norm_rope_cuda
from runner.backends.cuda import route as route_cuda
from runner.backends.cuda import top_k as top_k_cuda
from runner.backends.cuda.decode_graph import DecodeGraph
from runner.backends.cuda.decode_segments import SegmentedDecodeGraph
from runner.backends.cuda.token_graph import DirectoryDecodeGraph
from runner.backends.cuda.dequant import dequantize
from runner.backends.cuda.device_weights import DeviceTensor, DeviceWeights
from runner.backends.cuda.draft_graph import NextNGraphModel
from runner.backends.cuda.gemm import linear_large
from runner.backends.cuda.graph_pool import CudaGraphHooks, GraphPool
from runner.backends.cuda.greedy_chain import DeviceGreedyChain
from runner.backends.cuda.hybrid import CudaHybridOps
from runner.backends.cuda.moe_prefill import ExpertMatrixSet, moe_prefill, moe_prefill_scratch_bytes
from runner.backends.greedy_chain import SyncGreedyChain
from runner.backends.kv_type import DEFAULT_KV_TYPE, KVType, check_kv_type
from runner.backends.limits import SMALL_BATCH_ROWS
from runner.backends.step import RESIDENT, Step
from runner.engine.hybrid_cache import HybridCache
from runner.engine.sampling import top_k_pairs
from runner.errors import ModelFileError
from runner.gguf_file import TensorInfo
from runner.models.config import ModelConfig
from runner.models.weights import MoEWeights
from runner.offload.provider import MATRICES, ExpertMatrices, experts_by_recency

POSITION_BUFFERS = 64  # uploaded position arrays kept (a 128k prompt in 2048-token chunks)
# At decode sizes the norms run inside the products that read them (norm_linears: attention's q, k and v;
# norm_route: the router's product and its ranking), each CTA norming its rows: three launches fewer a MoE layer
# (142 of seed48's 625 graph nodes a token), the same bits. On: resident seed48 on an H100, three processes an arm
# alternated in one call, 4.88 ms of GPU a token against main's 5.01 (docs/perf/2026-12-07f-seed48-gemv-ctas-h100.md);
# offloaded alone unmeasured. FUSED_COMBINE (the expert sum in the down products' launch, by each column tile's last
# block: 47 nodes) stays off: alone it took 5.16 ms against 5.01, its one block a tile on the critical path.
FUSED_NORMS = True
FUSED_COMBINE = False

# One launch for the three pointer tables of a decode MoE step: pairs 0 .. n_pairs - 1, expert id -> address of
# its matrix; the tables' entries past them (a folded shared expert, one pair per token) get its addresses.
_PAIR_POINTERS = cp.ElementwiseKernel(
    "raw int32 e, int32 n_pairs, uint64 g0, uint64 u0, uint64 d0, uint64 g_stride, uint64 u_stride, uint64 d_stride,"
    " uint64 gs, uint64 us, uint64 ds",
    "uint64 g, uint64 u, uint64 d",
    "if (i < n_pairs) { g = g0 + (unsigned long long)e[i] * g_stride; u = u0 + (unsigned long long)e[i] * u_stride;"
    " d = d0 + (unsigned long long)e[i] * d_stride; } else { g = gs; u = us; d = ds; }",
    "runner_pair_expert_pointers",
)


def free_device_bytes() -> int:
    free, _total = cp.cuda.runtime.memGetInfo()
    return int(free)


class CudaOps(CudaHybridOps):
    """Arrays are float32 CuPy arrays; weights are uploaded once as raw GGUF blocks (DeviceWeights).

    A hybrid model's decode and verify steps run eagerly: its DeltaNet states are new arrays every step,
    which a replayed graph would not hand to the sequence cache (its NextN block, gated attention over a
    plain KV cache, still drafts from graphs)."""

    name = "cuda"

    def __init__(self, budget: DeviceBudget | None = None, prefill_precision: str = "f16", graphs: bool = True,
                 kv_type: KVType = DEFAULT_KV_TYPE):
        self.budget = budget or DeviceBudget(free_device_bytes())
        # Temporaries come from CuPy's pool; capping it at the budget makes "every allocation" true.
        pool = cp.get_default_memory_pool()
        pool.free_all_blocks()
        pool.set_limit(size=self.budget.limit_bytes)
        self.weights = DeviceWeights(self.budget)
        last_block_counters.counters()  # made now, never first inside a graph's capture
        self._addresses: dict[tuple[str, int], cp.ndarray] = {}  # (tensor, n) -> its address n times
        self.prefill_precision = prefill_precision
        self.kv_type = check_kv_type(kv_type)  # the attention kernels read either type as it is stored
        self._n_buffers = 0
        self._positions: dict[tuple[int, int], cp.ndarray] = {}  # (first, count) -> device positions
        self._pair_rows: dict[tuple[int, int, bool], cp.ndarray] = {}  # (tokens, k, folded) -> token of each pair
        self._fold_tails: dict[tuple[str, ...], np.ndarray | None] = {}  # shared and routed matrices -> addresses
        self.graphs = graphs
        # Per KV cache and row count (1: decode, more: MTP verify batches): (id(kv), rows) -> graph, and the NextN
        # block's draft steps: ("draft", id(kv), rows) -> graph. Each keeps its temporaries as its own stream's
        # blocks in graph_pool, where a prompt cannot reach them: decode and verify at depth 1..3 hold 10 rows',
        # the drafts as many of one layer.
        self._decode_graphs: dict[tuple, DecodeGraph | SegmentedDecodeGraph] = {}
        # While a list: each replay of a whole-step graph (resident or directory; decode, verify, draft) appends its
        # GPU time in ms, read between CUDA events on the graph's stream (runner profile's GPU and host split).
        self.replay_times_ms: list[float] | None = None
        self.graph_pool = GraphPool(cp, self.budget.limit_bytes)
        self._resident_sets: dict[str, ExpertMatrixSet] = {}

    @property
    def row_invariant_prompts(self) -> bool:
        """At fp16 precision every prompt product (linear_rows, the grouped expert GEMMs), norm, rotary
        and attention row gives the same bits whatever other rows share its batch (beyond
        SMALL_BATCH_ROWS), so layer-major offload may run a layer's feed-forward half over many
        micro-batches at once; the f32 check path's SGEMMs are not."""
        return self.prefill_precision == "f16"

    # -- memory -----------------------------------------------------------------------------------
    def check_weights(self, tensors: list[TensorInfo], keep_on_host: frozenset[str] = frozenset()) -> None:
        """Refuse types the kernels cannot read, then upload every tensor but those in `keep_on_host`
        (the routed experts, under expert offload)."""
        for info in tensors:
            if info.data.ndim > 1 and info.qtype not in gemv_cuda.SUPPORTED_QTYPES:
                names = ", ".join(sorted(t.name for t in gemv_cuda.SUPPORTED_QTYPES))
                raise ModelFileError(
                    f"tensor '{info.name}' is {info.qtype.name}, which the CUDA backend cannot read yet "
                    f"(supported: {names}); use --backend numpy"
                )
        uploads = [info for info in tensors if info.name not in keep_on_host]
        # Vectors go up as float32 copies, matrices as their raw blocks (DeviceWeights).
        self.budget.check_fits((f"weight {info.name}", 4 * int(np.prod(info.shape)) if len(info.shape) == 1
                                else int(info.data.nbytes)) for info in uploads
                               if f"weight {info.name}" not in self.budget.held)
        for info in uploads:
            if len(info.shape) == 1:
                self.weights.vector(info)
            else:
                self.weights.tensor(info)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> cp.ndarray:
        """A persistent zeroed buffer (the KV cache), reserved in the budget."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        self._n_buffers += 1
        self.budget.reserve(f"buffer {self._n_buffers} {list(shape)} {dtype.name}", nbytes)
        return cp.zeros(shape, dtype=dtype)

    def to_host(self, x: cp.ndarray) -> np.ndarray:
        return cp.asnumpy(x)

    def greedy_token(self, logits: cp.ndarray) -> int | None:
        return greedy_cuda.greedy_token(logits)

    def greedy_rows(self, logits: cp.ndarray) -> list[int | None]:
        return greedy_cuda.greedy_rows(logits)

    def top_k(self, logits: cp.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """On the device where top_k.cu takes the row and k (top_k_cuda.fits), else from the downloaded row."""
        if top_k_cuda.fits(logits.size, k):
            return top_k_cuda.top_k(logits, k)
        return top_k_pairs(cp.asnumpy(logits), k)

    def from_host(self, x: np.ndarray) -> cp.ndarray:
        """A temporary from CuPy's pool (capped at the budget), like any other op's output."""
        return cp.asarray(x)

    def kv_store(self, k_buf: cp.ndarray, v_buf: cp.ndarray, positions: np.ndarray, k: cp.ndarray,
                 v: cp.ndarray, step: Step = RESIDENT) -> tuple[cp.ndarray, cp.ndarray]:
        """Float32 K/V rows rounded to the buffers' type (to nearest even, numpy's rounding) and written at
        their positions; the cached rows up to the batch's end (a graph's step: the whole buffers)."""
        k, v = k.astype(k_buf.dtype, copy=False), v.astype(v_buf.dtype, copy=False)
        if step.graph is not None:  # at the device-side position; attention then masks the whole buffer
            k_buf[step.graph.position] = k
            v_buf[step.graph.position] = v
            return k_buf, v_buf
        start, end = int(positions[0]), int(positions[-1]) + 1
        k_buf[start:end] = k
        v_buf[start:end] = v
        return k_buf[:end], v_buf[:end]

    def _device_positions(self, positions: np.ndarray, step: Step) -> cp.ndarray:
        if step.graph is not None:
            return step.graph.position
        # Every layer asks for the same positions, and a layer-major prompt cycles through its chunks':
        # keep a few uploaded, since each upload from pageable memory waits for the GPU to drain.
        key = (int(positions[0]), len(positions)) if len(positions) else (0, 0)
        got = self._positions.get(key)
        if got is None:
            if len(self._positions) >= POSITION_BUFFERS:
                self._positions.pop(next(iter(self._positions)))
            got = self._positions[key] = cp.asarray(positions.astype(np.int32))
        return got

    # -- decode steps ----------------------------------------------------------------------------
    def decode_forward(self, model: Any, token: int, kv: Any, step: Step = RESIDENT) -> tuple[cp.ndarray, cp.ndarray]:
        """model.forward of one token, replayed from CUDA graphs after the first two steps: one graph, or
        under expert offload one segment per MoE layer's router and one more (decode_segments.py)."""
        if not self.graphs or isinstance(kv, HybridCache):
            return model.forward(np.asarray([token]), kv, step=step)
        return self._graph(model, kv, step, 1).step([token])

    def greedy_chain(self, model: Any, kv: Any, step: Step = RESIDENT) -> DeviceGreedyChain | SyncGreedyChain:
        """Greedy steps one behind the other on the whole-step decode graph's stream (greedy_chain.py); a step
        at a time where none serves (eager, a hybrid cache, segmented offload graphs: host steps mid-token)."""
        if not self.graphs or isinstance(kv, HybridCache) or not issubclass(_graph_kind(step), DecodeGraph):
            return SyncGreedyChain(self, model, kv, step)
        return DeviceGreedyChain(lambda: self._graph(model, kv, step, 1))

    def verify_forward(self, model: Any, tokens: Sequence[int], kv: Any,
                       step: Step = RESIDENT) -> tuple[cp.ndarray, cp.ndarray]:
        """model.forward of a verify batch with every row's logits, replayed like decode_forward from graphs
        of len(tokens) rows (one per row count, beside the decode graph); eager past SMALL_BATCH_ROWS."""
        if not self.graphs or len(tokens) > SMALL_BATCH_ROWS or isinstance(kv, HybridCache):
            return model.forward(np.asarray(tokens), kv, all_logits=True, step=step)
        return self._graph(model, kv, step, len(tokens)).step(tokens)

    def draft_forward(self, block: Any, hidden: cp.ndarray, tokens: Sequence[int], kv: Any,
                      step: Step = RESIDENT) -> tuple[cp.ndarray, cp.ndarray]:
        """block.forward (the NextN block) of hidden rows and their tokens, replayed from a graph of len(tokens)
        rows like verify_forward (its hidden rows copied into the graph's input buffer first); eager past
        SMALL_BATCH_ROWS. A graph's outputs are buffers its next step overwrites."""
        if not self.graphs or len(tokens) > SMALL_BATCH_ROWS:
            return block.forward(hidden, np.asarray(tokens), kv, step)
        graph = self._draft_graph(block, kv, step, len(tokens))
        graph.model.load(hidden, graph.stream)
        return graph.step(tokens)

    def _graph(self, model: Any, kv: Any, step: Step, rows: int) -> DecodeGraph | SegmentedDecodeGraph:
        """The graph of `rows` rows serving `kv`, made anew when the model or the expert provider changed."""
        graph = self._decode_graphs.get((id(kv), rows))
        if graph is None or graph.model is not model or not _serves(graph, kv, step):
            self._drop_graph((id(kv), rows))
            graph = self._decode_graphs[(id(kv), rows)] = _graph_kind(step)(model, kv, step.experts, rows,
                                                                            pool=self.graph_pool)
        return self._timed(graph)

    def _draft_graph(self, block: Any, kv: Any, step: Step, rows: int) -> DecodeGraph | SegmentedDecodeGraph:
        """The graph of `rows` rows running `block` on `kv`, over an adapter that holds its hidden input."""
        key = ("draft", id(kv), rows)
        graph = self._decode_graphs.get(key)
        if graph is None or graph.model.block is not block or not _serves(graph, kv, step):
            self._drop_graph(key)
            graph = self._decode_graphs[key] = _graph_kind(step)(NextNGraphModel(block, rows), kv, step.experts, rows,
                                                                 pool=self.graph_pool)
        return self._timed(graph)

    def _timed(self, graph: DecodeGraph | SegmentedDecodeGraph) -> DecodeGraph | SegmentedDecodeGraph:
        """`graph`, recording its replays' GPU times into replay_times_ms while that is a list (whole-step graphs
        only: a segmented step's GPU time is several graphs and the host steps between them)."""
        if isinstance(graph, DecodeGraph):
            graph.gpu_times_ms = self.replay_times_ms
        return graph

    def _drop_graph(self, key: tuple) -> None:
        """Forget the graph under `key`, if any, and give back its temporaries' blocks."""
        graph = self._decode_graphs.pop(key, None)
        if graph is not None:
            self.graph_pool.release(graph.stream)

    def decode_graph(self, kv: Any, rows: int = 1) -> DecodeGraph | SegmentedDecodeGraph | None:
        """The graph serving `kv` now for batches of `rows` tokens (1: decode; None before its first step,
        after invalidation, or eager)."""
        graph = self._decode_graphs.get((id(kv), rows))
        return graph if graph is not None and graph.kv is kv else None

    def draft_graph(self, kv: Any, rows: int = 1) -> DecodeGraph | SegmentedDecodeGraph | None:
        """The graph serving the NextN cache `kv` now for draft steps of `rows` rows (None as decode_graph)."""
        graph = self._decode_graphs.get(("draft", id(kv), rows))
        return graph if graph is not None and graph.kv is kv else None

    def graph_warming(self, kv: Any, rows: int, draft: bool = False) -> bool:
        """Whether the next step of `rows` on `kv` (a draft step of the NextN block: `draft`) warms up or
        captures its graph instead of replaying it."""
        if not self.graphs or rows > SMALL_BATCH_ROWS or isinstance(kv, HybridCache):
            return False
        graph = self.draft_graph(kv, rows) if draft else self.decode_graph(kv, rows)
        return graph is None or not graph.captured

    def invalidate_graphs(self) -> None:
        """Forget every captured graph, decode, verify and draft, and give back what their temporaries held."""
        for key in list(self._decode_graphs):
            self._drop_graph(key)

    def offload_backend(self, cfg: ModelConfig, weights: Any, n_ctx: int, decode_batch: int = 1) -> Any:
        """What expert offload needs from this backend: the budget, a device arena on a copy stream,
        pinned host memory, and the decode graphs, kept through a prompt or dropped around it. The default
        pool leaves room for the graphs' own pool as long as the ledger keeps their share."""
        from runner.backends.cuda.expert_arena import CudaDeviceArena, pin_in_place
        from runner.backends.cuda.slot_directory import directories_for
        from runner.offload.backend import OffloadBackend, decode_workspaces

        workspaces, graph_workspaces = decode_workspaces(self.budget, cfg, n_ctx, decode_batch, self.graphs)
        outside_pool = (lambda: graph_workspaces.held_bytes) if graph_workspaces is not None else (lambda: 0)
        arena = CudaDeviceArena(self.budget, outside_pool=outside_pool)
        return OffloadBackend(self.budget, arena, workspaces, graphs=CudaGraphHooks(self), pin_host=pin_in_place,
                              prefill_scratch_bytes=moe_prefill_scratch_bytes(cfg), graph_workspaces=graph_workspaces,
                              directories=directories_for)

    # -- dense math ------------------------------------------------------------------------------
    def embed(self, table: TensorInfo, ids: np.ndarray, step: Step = RESIDENT) -> cp.ndarray:
        t = self.weights.tensor(table)
        ids_dev = step.graph.token if step.graph is not None else cp.asarray(ids.astype(np.int64))
        rows = t.raw[ids_dev]
        return dequantize(cp.ascontiguousarray(rows), t.qtype, t.row_length, np.float32)

    def vector(self, info: TensorInfo) -> cp.ndarray:
        return self.weights.vector(info)

    def _product(self, x: cp.ndarray, t: DeviceTensor) -> cp.ndarray:
        x = cp.ascontiguousarray(x)
        if x.shape[0] <= SMALL_BATCH_ROWS:
            return gemv_cuda.gemv(x, t.raw, t.qtype, t.row_length)
        return linear_large(x, t.raw, t.qtype, t.row_length, self.prefill_precision)

    def linear(self, x: cp.ndarray, w: TensorInfo, bias: TensorInfo | None = None,
               residual: cp.ndarray | None = None) -> cp.ndarray:
        if len(w.shape) == 1:  # a 1-D weight (a hybrid's ffn_gate_inp_shexp), uploaded as a vector: [T]
            assert bias is None and residual is None, f"a 1-D weight '{w.name}' takes no bias or residual"
            return delta_net_cuda.row_dot(cp.ascontiguousarray(x), self.weights.vector(w))
        t, b = self.weights.tensor(w), self.weights.vector(bias) if bias is not None else None
        x = cp.ascontiguousarray(x)
        if (b is not None or residual is not None) and x.shape[0] <= SMALL_BATCH_ROWS:
            r = cp.ascontiguousarray(residual) if residual is not None else None
            return gemv_cuda.gemv(x, t.raw, t.qtype, t.row_length, bias=b, residual=r)  # the adds in its launch
        y = self._product(x, t)
        if b is not None:
            y += b
        return y if residual is None else residual + y

    def linears(self, x: cp.ndarray, ws: Sequence[TensorInfo], biases: Sequence[TensorInfo | None]) -> list[cp.ndarray]:
        x = cp.ascontiguousarray(x)
        if not (self._multi(ws) and x.shape[0] <= SMALL_BATCH_ROWS):
            return [self.linear(x, w, b) for w, b in zip(ws, biases)]
        return gemv_cuda.gemv_multi(x, *self._multi_operands(x, ws, biases))

    def _multi(self, ws: Sequence[TensorInfo]) -> bool:
        """Whether gemv_multi takes these matrices: two or three, each 2-D."""
        return 2 <= len(ws) <= gemv_cuda.MAX_MULTI and all(len(w.shape) == 2 for w in ws)

    def _multi_operands(self, x: cp.ndarray, ws: Sequence[TensorInfo], biases: Sequence[TensorInfo | None]) -> tuple:
        """gemv_multi's (matrices, biases) of these weights, each matrix taking rows of x's length."""
        tensors = [self.weights.tensor(w) for w in ws]
        assert all(t.row_length == x.shape[1] for t in tensors), "linears: every matrix takes rows of x's length"
        return ([(t.raw, t.qtype) for t in tensors],
                [self.weights.vector(b) if b is not None else None for b in biases])

    def rms_norm(self, x: cp.ndarray, w: TensorInfo, eps: float) -> cp.ndarray:
        return norm_rope_cuda.rms_norm(cp.ascontiguousarray(x), self.weights.vector(w), eps)

    def norm_linears(self, x: cp.ndarray, norm: TensorInfo, eps: float, ws: Sequence[TensorInfo],
                     biases: Sequence[TensorInfo | None]) -> list[cp.ndarray]:
        x = cp.ascontiguousarray(x)
        if FUSED_NORMS and self._multi(ws) and gemv_cuda.normed_fits(*x.shape):
            return gemv_cuda.gemv_multi_normed(x, self.weights.vector(norm), eps, *self._multi_operands(x, ws, biases))
        return self.linears(self.rms_norm(x, norm, eps), ws, biases)

    def rope_neox(self, x: cp.ndarray, positions: np.ndarray, n_rot: int, base: float,
                  step: Step = RESIDENT) -> cp.ndarray:
        return norm_rope_cuda.rope_neox(cp.ascontiguousarray(x), self._device_positions(positions, step), n_rot, base)

    def rope_kv_store(self, q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, k_buf: cp.ndarray, v_buf: cp.ndarray,
                      positions: np.ndarray, n_rot: int, base: float,
                      step: Step = RESIDENT) -> tuple[cp.ndarray, cp.ndarray, cp.ndarray]:
        """rope_neox twice and kv_store in one launch, with their bits (a decode step saves five launches a layer)."""
        q, k, v = (cp.ascontiguousarray(a) for a in (q, k, v))
        # The kernel writes at the positions unchecked; kv_store's slice assignment refused rows past the buffers.
        assert step.graph is not None or int(positions[-1]) < k_buf.shape[0], (
            f"positions up to {int(positions[-1])} past the K/V buffers' {k_buf.shape[0]} rows")
        q = norm_rope_cuda.rope_store(q, k, v, k_buf, v_buf, self._device_positions(positions, step), n_rot, base)
        if step.graph is not None:  # written at the device-side positions; attention masks the whole buffers
            return q, k_buf, v_buf
        end = int(positions[-1]) + 1
        return q, k_buf[:end], v_buf[:end]

    def attention(self, q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, q_positions: np.ndarray,
                  step: Step = RESIDENT) -> cp.ndarray:
        n_kv = int(k.shape[0])
        # The positions are on the host here: check them here, not with attention()'s device-to-host copy,
        # which drained the stream once per chunk and layer of a prompt (16 x 47 times at 32k on seed48).
        if len(q_positions):
            attention_cuda.check_positions_in_range(q_positions, n_kv)
        return attention_cuda.attention(cp.ascontiguousarray(q), k, v, n_kv, self._device_positions(q_positions, step),
                                        check_positions=False, precision=self.prefill_precision)

    def swiglu(self, gate: cp.ndarray, up: cp.ndarray) -> cp.ndarray:
        return norm_rope_cuda.swiglu(gate, up)

    def swiglu_ffn(self, x: cp.ndarray, gate: TensorInfo, up: TensorInfo, down: TensorInfo) -> cp.ndarray:
        """At decode sizes gate, up and SwiGLU in one launch (expert_gate_up with one pair per row, every pair
        on these two matrices: bit-identical to gemv, gemv, swiglu), then down; else the three ops."""
        x = cp.ascontiguousarray(x)
        n_tok = x.shape[0]
        if n_tok > SMALL_BATCH_ROWS:
            return self.linear(self.swiglu(self.linear(x, gate), self.linear(x, up)), down)
        g, u = self.weights.tensor(gate), self.weights.tensor(up)
        h = gemv_cuda.expert_gate_up(x, self._rows(n_tok, 1), self._repeated_address(g, n_tok),
                                     self._repeated_address(u, n_tok), g.qtype, u.qtype, g.shape[0], g.row_length)
        return self._product(h, self.weights.tensor(down))

    def _repeated_address(self, t: DeviceTensor, n: int) -> cp.ndarray:
        """uint64 [n] of t's address, kept per (tensor, n): a graph replay reads it where it was captured."""
        got = self._addresses.get((t.name, n))
        if got is None:
            got = self._addresses[(t.name, n)] = cp.full(n, t.raw.data.ptr, dtype=cp.uint64)
        return got

    def concat(self, a: cp.ndarray, b: cp.ndarray) -> cp.ndarray:
        return cp.concatenate([a, b], axis=-1)

    def concat_rows(self, parts: Sequence[cp.ndarray]) -> cp.ndarray:
        return cp.concatenate(list(parts), axis=0)

    # -- mixture of experts -----------------------------------------------------------------------
    def route(self, logits: cp.ndarray, probs_bias: TensorInfo | None, cfg: ModelConfig) -> tuple[Any, Any]:
        bias = self.weights.vector(probs_bias) if probs_bias is not None else None
        return route_cuda.route(cp.ascontiguousarray(logits), bias, cfg.gating, cfg.n_expert_used,
                              cfg.n_expert_groups, cfg.n_group_used, cfg.expert_weights_norm,
                              cfg.expert_weights_scale)

    def norm_route(self, x: cp.ndarray, norm: TensorInfo, eps: float, router: TensorInfo,
                   probs_bias: TensorInfo | None, cfg: ModelConfig, beside: bool = False) -> tuple[cp.ndarray, Any, Any]:
        x = cp.ascontiguousarray(x)
        t = self.weights.tensor(router)
        if FUSED_NORMS and len(router.shape) == 2 and gemv_cuda.norm_route_fits(*x.shape, t.raw.shape[0], t.qtype):
            bias = self.weights.vector(probs_bias) if probs_bias is not None else None
            return gemv_cuda.gemv_norm_route(x, self.weights.vector(norm), eps, t.raw, t.qtype, bias, cfg.gating,
                                             cfg.n_expert_used, cfg.n_expert_groups, cfg.n_group_used,
                                             cfg.expert_weights_norm, cfg.expert_weights_scale, beside)
        h = self.rms_norm(x, norm, eps)
        ids, weights = self.route(self.linear(h, router), probs_bias, cfg)
        return h, ids, weights

    def moe(self, x: cp.ndarray, ids: cp.ndarray, weights: cp.ndarray, w: MoEWeights,
            step: Step = RESIDENT, with_shared: bool = False, residual: cp.ndarray | None = None) -> cp.ndarray:
        x = cp.ascontiguousarray(x)
        small = x.shape[0] <= SMALL_BATCH_ROWS
        # At decode sizes the shared expert is one more pair per token of the routed experts' launches, added
        # by combine after their sum: two GEMV launches and an add fewer a layer, the same bits.
        tail = self.fold_tail(w) if with_shared and small else None
        # combine adds the residual last, when it is the op's last sum (no shared expert added after it)
        fused = cp.ascontiguousarray(residual) if residual is not None and small and (tail is not None or not with_shared) \
            else None
        if step.experts is not None:
            out = self._moe_provided(x, ids, weights, w, step, tail, fused)
        else:
            tensors = [self.weights.tensor(t) for t in (w.gate_exps, w.up_exps, w.down_exps)]
            sets = tuple(self._resident_set(t) for t in tensors)
            if x.shape[0] <= SMALL_BATCH_ROWS:
                # Pointers computed on the device from device ids: no sync, so the step can be graph-captured.
                bases = [np.uint64(t.raw.data.ptr) for t in tensors] + [np.uint64(t.expert_bytes) for t in tensors]
                flat = ids.reshape(-1)
                width = flat.size + (x.shape[0] if tail is not None else 0)
                ptrs = tuple(cp.empty(width, dtype=cp.uint64) for _ in range(3))
                shared = tail if tail is not None else np.zeros(3, dtype=np.uint64)  # unread without a fold
                _PAIR_POINTERS(flat, np.int32(flat.size), *bases, *(np.uint64(a) for a in shared), *ptrs)
                out = self._moe_small(x, ids.shape, weights, ptrs, sets, tail is not None, fused)
            else:
                out = self._moe_grouped(x, ids, weights, sets)
        if with_shared and tail is None:
            assert w.shared is not None, "with_shared on a MoE layer without a shared expert"
            out = out + self.swiglu_ffn(x, w.shared.gate, w.shared.up, w.shared.down)
        return out if residual is None or fused is not None else residual + out

    def fold_tail(self, w: MoEWeights) -> np.ndarray | None:
        """uint64 [3]: the shared expert's gate, up and down device addresses when it can be one more pair of
        the routed experts' launches (each matrix of the routed experts' type and shape: a launch takes one
        type per matrix), else None. Decode graphs put it at the end of their pair tables."""
        if w.shared is None:
            return None
        shared, routed = (w.shared.gate, w.shared.up, w.shared.down), (w.gate_exps, w.up_exps, w.down_exps)
        key = tuple(t.name for t in (*shared, *routed))
        if key not in self._fold_tails:
            fits = all(s.qtype == r.qtype and len(r.shape) == 3 and tuple(s.shape) == tuple(r.shape[1:])
                       for s, r in zip(shared, routed))
            self._fold_tails[key] = (np.array([self.weights.tensor(s).raw.data.ptr for s in shared], dtype=np.uint64)
                                     if fits else None)
        return self._fold_tails[key]

    def _moe_provided(self, x, ids, weights, w: MoEWeights, step: Step, tail: np.ndarray | None,
                      residual: cp.ndarray | None = None) -> cp.ndarray:
        """Experts from the step's provider (expert offload: cache slots or prefill staging), by device address;
        `tail`: the shared expert's addresses to fold in as one more pair per token (decode sizes); `residual`:
        added last by combine (decode sizes only)."""
        if isinstance(step.graph, (SegmentedDecodeGraph, DirectoryDecodeGraph)):  # a decode or verify step
            assert x.shape[0] == step.graph.rows, f"a segmented graph of {step.graph.rows} rows got {x.shape[0]}"
            ptrs = step.graph.expert_pointers(w, ids, tail)  # tables that outlive the step
            folded = ptrs[0].size > ids.size
            assert folded == (tail is not None), f"layer {w.router.name}: the graph's tables and the fold disagree"
            passes = step.graph.fill_passes(w) if isinstance(step.graph, DirectoryDecodeGraph) else None
            return self._moe_small(x, ids.shape, weights, ptrs, _provided_sets(w, {}), folded, residual,  # types, shapes
                                   passes)
        ids_host = cp.asnumpy(ids)  # which experts to fetch decides the uploads: one sync per layer
        wanted = experts_by_recency(ids_host)
        addresses = getattr(step.experts, "prompt_addresses", None)
        table = addresses(w, wanted) if addresses is not None and x.shape[0] > SMALL_BATCH_ROWS else None
        if table is not None:  # a streamed prompt: addresses straight from the staging layout, no views
            sets = tuple(ExpertMatrixSet(info.qtype, info.shape[-2], info.shape[-1], row)
                         for info, row in zip((w.gate_exps, w.up_exps, w.down_exps), table))
            return self._moe_grouped(x, ids, weights, sets, ids_host)
        sets = _provided_sets(w, step.experts.fetch(w, wanted))
        if x.shape[0] <= SMALL_BATCH_ROWS:
            flat = ids_host.reshape(-1)
            if tail is None:
                ptrs = tuple(cp.asarray(s.ptrs[flat]) for s in sets)
            else:
                ptrs = tuple(cp.asarray(np.concatenate([s.ptrs[flat], np.full(x.shape[0], a, dtype=np.uint64)]))
                             for s, a in zip(sets, tail))
            return self._moe_small(x, ids.shape, weights, ptrs, sets, tail is not None, residual)
        assert residual is None, "combine adds a residual at decode sizes only"
        return self._moe_grouped(x, ids, weights, sets, ids_host)

    def _resident_set(self, t: DeviceTensor) -> ExpertMatrixSet:
        got = self._resident_sets.get(t.name)
        if got is None:
            got = self._resident_sets[t.name] = ExpertMatrixSet.resident(t)
        return got

    def _moe_small(self, x, ids_shape: tuple[int, int], weights, ptrs, sets, folded: bool = False,
                   residual: cp.ndarray | None = None, passes: tuple[cp.ndarray, Any, Any] | None = None) -> cp.ndarray:
        """Decode / verify: every (token, expert) pair in one gate-up launch and one down launch; `folded`: the
        pointer tables end with one shared-expert pair per token, which combine adds after the routed sum; then
        `residual`, last. `passes` (a directory graph's (flags, gate-up event, down event)): the pairs whose
        experts are held first, while their fills run on another stream, then the filled ones, their gate-up
        after the first event and their down after the second."""
        n_tok, k = ids_shape
        gate, up, down = sets
        g, u, d = ptrs
        rows = self._rows(n_tok, k, folded)
        down_rows = self._rows(rows.size, 1)
        h = cp.empty((rows.size, gate.rows), dtype=cp.float32)
        y = cp.empty((rows.size, down.rows), dtype=cp.float32)
        out = cp.empty((n_tok, down.rows), dtype=cp.float32) if FUSED_COMBINE else None
        for phase in (0, 1) if passes is not None else (None,):
            if phase == 1:
                cp.cuda.get_current_stream().wait_event(passes[1])
            which = None if phase is None else (passes[0], phase)
            gemv_cuda.expert_gate_up(x, rows, g, u, gate.qtype, up.qtype, gate.rows, gate.row_length, out=h,
                                     passes=which)
            if phase == 1 and passes[2] is not passes[1]:
                cp.cuda.get_current_stream().wait_event(passes[2])
            if out is not None:  # the down products and their sum in one launch (a pass's)
                gemv_cuda.expert_down_combine(h, down_rows, d, down.qtype, down.rows, down.row_length, y, weights,
                                              residual, folded, which, out)
            else:
                gemv_cuda.expert_gemv(h, down_rows, d, down.qtype, down.rows, down.row_length, out=y, passes=which)
        return out if out is not None else route_cuda.combine(y, weights, residual=residual, shared=folded)

    def _rows(self, n_tok: int, k: int, folded: bool = False) -> cp.ndarray:
        """Row of x for each of n_tok * k pairs (pair t*k + j reads row t), then with `folded` one more pair per
        token (pair n_tok*k + t reads row t), cached per shape."""
        rows = self._pair_rows.get((n_tok, k, folded))
        if rows is None:
            tokens = cp.arange(n_tok, dtype=cp.int32)
            rows = cp.repeat(tokens, k)
            if folded:
                rows = cp.concatenate([rows, tokens])
            self._pair_rows[(n_tok, k, folded)] = rows
        return rows

    def _moe_grouped(self, x, ids, weights, sets, ids_host: np.ndarray | None = None) -> cp.ndarray:
        """Prefill: pairs sorted by expert, grouped GEMMs on tensor cores per chunk of experts, combined per
        token. `ids_host`, when the caller has the ids on the host already, spares moe_prefill a sync."""
        if self.prefill_precision == "f32":
            return route_cuda.combine(_moe_pairs_f32(x, ids, *sets), weights)
        return moe_prefill(x, ids, weights, *sets, ids_host=ids_host)


def _graph_kind(step: Step) -> type[DecodeGraph] | type[SegmentedDecodeGraph]:
    """Resident experts: one graph; offloaded: the device directories' one graph when the provider asks
    for it (--decode-graph directory), else segments with a host step at each router."""
    if step.experts is None:
        return DecodeGraph
    return DirectoryDecodeGraph if getattr(step.experts, "decode_graph", None) == "directory" else SegmentedDecodeGraph


def _serves(graph: DecodeGraph | SegmentedDecodeGraph, kv: Any, step: Step) -> bool:
    """`graph` still runs on `kv` with `step`'s experts (the key's id(kv) may be a new cache's)."""
    return graph.kv is kv and type(graph) is _graph_kind(step) and graph.experts is step.experts


def _moe_pairs_f32(x, ids, gate: ExpertMatrixSet, up: ExpertMatrixSet, down: ExpertMatrixSet) -> cp.ndarray:
    """The float32 check path of moe_prefill: one expert at a time, SGEMM on dequantized copies."""
    flat = cp.asnumpy(ids).reshape(-1)
    k = ids.shape[1]
    y_pairs = cp.empty((flat.size, down.rows), dtype=cp.float32)
    for expert in np.unique(flat):
        pairs = np.nonzero(flat == expert)[0]
        xe = x[cp.asarray(pairs // k)]
        one = np.array([expert])
        h = norm_rope_cuda.swiglu(xe @ gate.dense(one, np.float32)[0].T, xe @ up.dense(one, np.float32)[0].T)
        y_pairs[cp.asarray(pairs)] = h @ down.dense(one, np.float32)[0].T
    return y_pairs


def _provided_sets(w: MoEWeights, got: Mapping[int, ExpertMatrices]) -> tuple[ExpertMatrixSet, ...]:
    """Gate, up and down of the experts a provider returned for the MoE layer `w`."""
    return tuple(_provided_set(info, got, which) for info, which in zip((w.gate_exps, w.up_exps, w.down_exps),
                                                                        MATRICES))


def _provided_set(info: TensorInfo, got: Mapping[int, ExpertMatrices], which: str) -> ExpertMatrixSet:
    """One matrix of the experts a provider returned, by device address (0 for the experts it did not)."""
    ptrs = np.zeros(info.shape[0], dtype=np.uint64)
    for e, m in got.items():
        ptrs[e] = getattr(m, which).data.ptr
    return ExpertMatrixSet(info.qtype, info.shape[-2], info.shape[-1], ptrs)
