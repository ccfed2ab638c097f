"""The ops a backend implements: everything the model definitions in runner/models/ call.

NumpyOps (backends/numpy/ops.py) is the reference and CudaOps (backends/cuda/ops.py) its twin; one
forward pass runs on either. `Array` is the backend's array type (numpy or CuPy float32); weights are
TensorInfo views of the GGUF file, which each backend reads (or uploads once) in its own way.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from runner.backends.step import Step
from runner.gguf_file import TensorInfo
from runner.models.config import ModelConfig
from runner.models.weights import MoEWeights

Array = Any  # numpy.ndarray or cupy.ndarray, float32


@runtime_checkable
class Ops(Protocol):
    name: str
    kv_type: str  # the K/V cache's element type, "f16" or "f32" (backends/kv_type.py)

    # memory
    def check_weights(self, tensors: list[TensorInfo], keep_on_host: frozenset[str] = frozenset()) -> None:
        """Refuse tensor types this backend cannot read; place every tensor but `keep_on_host`."""

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> Array:
        """A persistent zeroed buffer (the KV cache in its kv_type, a hybrid's float32 DeltaNet state)."""

    def to_host(self, x: Array) -> np.ndarray: ...

    def greedy_token(self, logits: Array) -> int | None:
        """The index of the largest of a logits row (the first of equals, as np.argmax), or None when a value is
        NaN or infinite; chosen where the logits are (CUDA downloads two ints, not the row)."""

    def greedy_rows(self, logits: Array) -> list[int | None]:
        """greedy_token of each row of logits [R, vocab], in order (a verify batch's), with one wait: CUDA
        downloads 2 R ints, not the rows."""

    def top_k(self, logits: Array, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(ids int64 [k], values float32 [k]) of a logits row's k largest, largest first, equal values by lower id
        (sampling.best_first's order), or None when a value is NaN or infinite; 0 < k < the row's length. Chosen
        where the logits are (CUDA downloads the k pairs, not the row)."""

    def from_host(self, x: np.ndarray) -> Array:
        """A new backend array holding a copy of host array `x` (the prompt cache restores state with it)."""

    # decode
    def decode_forward(self, model: Any, token: int, kv: Any, step: Step) -> tuple[Array, Array]:
        """One token through `model`: (logits [1, vocab], hidden [1, n_embd]); CUDA replays graphs here."""

    def greedy_chain(self, model: Any, kv: Any, step: Step) -> Any:
        """Greedy decode steps of `model` on `kv` queued ahead of the host (backends/greedy_chain.py's GreedyChain):
        CUDA enqueues each step behind the last without waiting; numpy runs them at submit."""

    def verify_forward(self, model: Any, tokens: Sequence[int], kv: Any, step: Step) -> tuple[Array, Array]:
        """An MTP verify batch (the pending token and its drafts) through `model`: (logits [T, vocab], hidden
        [T, n_embd]), every row's logits; CUDA replays a graph per row count here."""

    def draft_forward(self, block: Any, hidden: Array, tokens: Sequence[int], kv: Any,
                      step: Step) -> tuple[Array, Array]:
        """A draft step of the NextN block: block.forward(hidden [T, n_embd], tokens [T], kv) -> (logits
        [T, vocab], hidden [T, n_embd]); CUDA replays a graph per row count here, whose outputs its next
        step overwrites."""

    def graph_warming(self, kv: Any, rows: int, draft: bool = False) -> bool:
        """Whether the next decode (rows 1) or verify batch of `rows` on `kv` (with `draft`: the next draft step
        of `rows` on the NextN cache `kv`) is a graph's warm-up or capture rather than a replay: its time says
        nothing of the steady cost (always False without graphs)."""

    def kv_store(self, k_buf: Array, v_buf: Array, positions: np.ndarray, k: Array, v: Array,
                 step: Step) -> tuple[Array, Array]:
        """Write float32 K/V rows at `positions`, rounded to the buffers' type; every cached row up to the
        batch's end."""

    # dense math
    def embed(self, table: TensorInfo, ids: np.ndarray, step: Step) -> Array: ...

    def vector(self, info: TensorInfo) -> Array: ...

    def linear(self, x: Array, w: TensorInfo, bias: TensorInfo | None = None, residual: Array | None = None) -> Array:
        """x [T, K] @ w.T [K, N] (+ bias): w in its GGUF type; `residual` [T, N]: residual + that, a layer's skip
        connection in the same op (CUDA: the GEMV's launch adds it at decode sizes)."""

    def linears(self, x: Array, ws: Sequence[TensorInfo], biases: Sequence[TensorInfo | None]) -> list[Array]:
        """[linear(x, w, b) for w, b in zip(ws, biases)] with their bits: one op so a backend can run products of
        the same x together (CUDA: attention's q, k and v in one launch at decode sizes)."""

    def rms_norm(self, x: Array, w: TensorInfo, eps: float) -> Array: ...

    def norm_linears(self, x: Array, norm: TensorInfo, eps: float, ws: Sequence[TensorInfo],
                     biases: Sequence[TensorInfo | None]) -> list[Array]:
        """linears(rms_norm(x, norm, eps), ws, biases) with its bits (CUDA at decode sizes: one launch, each block
        norming the rows itself)."""

    def rope_neox(self, x: Array, positions: np.ndarray, n_rot: int, base: float, step: Step) -> Array: ...

    def rope_kv_store(self, q: Array, k: Array, v: Array, k_buf: Array, v_buf: Array, positions: np.ndarray,
                      n_rot: int, base: float, step: Step) -> tuple[Array, Array, Array]:
        """rope_neox of q and of k, then kv_store of k and v: (q rotated, every cached K, V up to the batch's
        end). One op so a backend can fuse the three (CUDA: one launch)."""

    def attention(self, q: Array, k: Array, v: Array, q_positions: np.ndarray, step: Step) -> Array:
        """Causal GQA attention of q [T, H, D] over the cached k, v [S, Hkv, D] (float32 or float16);
        float32 [T, H * D]."""

    def swiglu(self, gate: Array, up: Array) -> Array: ...

    def swiglu_ffn(self, x: Array, gate: TensorInfo, up: TensorInfo, down: TensorInfo) -> Array:
        """linear(swiglu(linear(x, gate), linear(x, up)), down): a dense feed-forward or a shared expert, as
        one op so a backend can fuse it (CUDA at decode sizes: two launches instead of four)."""

    def concat(self, a: Array, b: Array) -> Array: ...

    def concat_rows(self, parts: Sequence[Array]) -> Array: ...

    # mixture of experts
    def route(self, logits: Array, probs_bias: TensorInfo | None, cfg: ModelConfig) -> tuple[Any, Array]:
        """Router logits [T, E] -> expert ids [T, k] and their weights [T, k]."""

    def norm_route(self, x: Array, norm: TensorInfo, eps: float, router: TensorInfo, probs_bias: TensorInfo | None,
                   cfg: ModelConfig, beside: bool = False) -> tuple[Array, Any, Array]:
        """A MoE layer's pre-norm and router: (h, ids, weights) with h = rms_norm(x, norm, eps) and (ids, weights) =
        route(linear(h, router), probs_bias, cfg), with their bits (CUDA at decode sizes: one launch). `beside`:
        it may run on another stream while this stream's own router runs (a prefetch's guess)."""

    def moe(self, x: Array, ids: Any, weights: Array, w: MoEWeights, step: Step, with_shared: bool = False,
            residual: Array | None = None) -> Array:
        """Sum over each token's experts of weight * down(silu(gate x) * up x), experts from `step`'s provider;
        `with_shared`: plus w.shared's swiglu_ffn(x), added after the sum (CUDA folds it into the routed
        experts' launches at decode sizes, with those bits); `residual` [T, d]: residual + all that, the
        layer's skip connection in the same op (CUDA: combine adds it last at decode sizes, one launch fewer)."""
