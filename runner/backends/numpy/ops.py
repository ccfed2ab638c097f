"""Reference ops on the CPU: weights dequantized by `gguf.quants`, all math in float32.

Every backend implements these methods with the same signatures; the model definition in
`runner/models/` calls nothing else, so one forward pass runs on both.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

import numpy as np
from gguf.quants import dequantize

from runner.backends.greedy_chain import SyncGreedyChain
from runner.backends.kv_type import DEFAULT_KV_TYPE, KVType, check_kv_type
from runner.backends.limits import SMALL_BATCH_ROWS
from runner.backends.numpy.activation_quant import Q8_1_TYPES, block_minima, q8_1_sum_error, round_activations
from runner.backends.numpy.hybrid import NumpyHybridOps
from runner.backends.step import RESIDENT, Step
from runner.engine.sampling import top_k_pairs
from runner.gguf_file import TensorInfo, check_reference_qtype
from runner.models.config import ModelConfig
from runner.models.weights import MoEWeights
from runner.offload.provider import ResidentExperts, experts_by_recency

Array = np.ndarray
_RESIDENT_EXPERTS = ResidentExperts()  # a step without a provider: experts straight from the file's map


class DequantCache:
    """Float32 copies of dequantized weights (whole tensors or single experts), least recently used out."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes_held = 0
        self._entries: OrderedDict[tuple[str, int], Array] = OrderedDict()

    def get(self, info: TensorInfo, expert: int = -1) -> Array:
        key = (info.name, expert)
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            return hit
        raw = info.data if expert < 0 else info.data[expert]
        shape = info.shape if expert < 0 else info.shape[1:]
        value = np.ascontiguousarray(dequantize(raw, info.qtype), dtype=np.float32).reshape(shape)
        self._entries[key] = value
        self.bytes_held += value.nbytes
        while self.bytes_held > self.max_bytes and len(self._entries) > 1:
            _, old = self._entries.popitem(last=False)
            self.bytes_held -= old.nbytes
        return value


class NumpyOps(NumpyHybridOps):
    """The reference backend. Arrays are float32 numpy arrays; weights are TensorInfo views of the file.
    It also implements HybridOps (the hybrid linear-attention families' ops, backends/hybrid_ops.py).

    By default all math is float32, as on the CUDA backend, so the two agree. With
    `llama_activations` each product's activations are first rounded to the weight type's llama.cpp
    CPU activation format (see activation_quant): the twin of llama.cpp's CPU path, for parity tests.
    K/V is cached as `kv_type` (backends/kv_type.py: f16 by default), rounded as it is stored.
    """

    name = "numpy"

    def __init__(self, cache_bytes: int = 2 << 30, llama_activations: bool = False, kv_type: KVType = DEFAULT_KV_TYPE):
        self.cache = DequantCache(cache_bytes)
        self.llama_activations = llama_activations
        self.kv_type = check_kv_type(kv_type)

    def _product(self, x: Array, w: TensorInfo, expert: int = -1) -> Array:
        """x [T, K] times the weight (or one expert of it) transposed -> [T, N].

        Batch invariant for T <= SMALL_BATCH_ROWS: BLAS picks other kernels (other reduction orders)
        for several rows than for one, so a verify batch is computed one row at a time, each row
        exactly as a single-token decode computes it.
        """
        if 1 < len(x) <= SMALL_BATCH_ROWS:
            return np.concatenate([self._product(x[i : i + 1], w, expert) for i in range(len(x))])
        dense = self.cache.get(w, expert)
        if not self.llama_activations:
            return x @ dense.T
        y = round_activations(x, w.qtype) @ dense.T
        if w.qtype in Q8_1_TYPES:
            raw = w.data if expert < 0 else w.data[expert]
            y += q8_1_sum_error(x) @ block_minima(raw, w.qtype).T
        return y

    # -- memory -----------------------------------------------------------------------------------
    def check_weights(self, tensors: list[TensorInfo], keep_on_host: frozenset[str] = frozenset()) -> None:
        """Refuse types the reference cannot read (every tensor stays in the file's memory map)."""
        for info in tensors:
            check_reference_qtype(info)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> Array:
        return np.zeros(shape, dtype=dtype)

    def to_host(self, x: Array) -> np.ndarray:
        return np.asarray(x)

    def greedy_token(self, logits: Array) -> int | None:
        row = np.asarray(logits).reshape(-1)
        return int(np.argmax(row)) if np.isfinite(row).all() else None

    def greedy_rows(self, logits: Array) -> list[int | None]:
        return [self.greedy_token(row) for row in np.asarray(logits)]

    def top_k(self, logits: Array, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        return top_k_pairs(logits, k)

    def from_host(self, x: np.ndarray) -> Array:
        return np.array(x)  # a copy, as an upload is: the cache entry and the live state never alias

    def decode_forward(self, model: Any, token: int, kv: Any, step: Step = RESIDENT) -> tuple[Array, Array]:
        """One token through `model` (the CUDA backend replays a graph here)."""
        return model.forward(np.asarray([token]), kv, step=step)

    def greedy_chain(self, model: Any, kv: Any, step: Step = RESIDENT) -> SyncGreedyChain:
        """Each step runs at submit (nothing to overlap on the CPU)."""
        return SyncGreedyChain(self, model, kv, step)

    def verify_forward(self, model: Any, tokens: Sequence[int], kv: Any, step: Step = RESIDENT) -> tuple[Array, Array]:
        """A verify batch through `model` with every row's logits (the CUDA backend replays a graph here)."""
        return model.forward(np.asarray(tokens), kv, all_logits=True, step=step)

    def draft_forward(self, block: Any, hidden: Array, tokens: Sequence[int], kv: Any,
                      step: Step = RESIDENT) -> tuple[Array, Array]:
        """A draft step of the NextN block (the CUDA backend replays a graph here)."""
        return block.forward(hidden, np.asarray(tokens), kv, step)

    def graph_warming(self, kv: Any, rows: int, draft: bool = False) -> bool:
        return False  # no graphs: every step runs as it always will

    def kv_store(self, k_buf: Array, v_buf: Array, positions: np.ndarray, k: Array, v: Array,
                 step: Step = RESIDENT) -> tuple[Array, Array]:
        """Write a batch's K/V rows at its (consecutive) positions, rounded to the buffers' type (to nearest
        even, as CUDA rounds); the cached rows up to its end."""
        start, end = int(positions[0]), int(positions[-1]) + 1
        k_buf[start:end] = k
        v_buf[start:end] = v
        return k_buf[:end], v_buf[:end]

    # -- dense math ------------------------------------------------------------------------------
    def embed(self, table: TensorInfo, ids: np.ndarray, step: Step = RESIDENT) -> Array:
        rows = table.data[ids]  # only the rows asked for are read and dequantized
        return dequantize(rows, table.qtype).astype(np.float32, copy=False).reshape(len(ids), table.row_length)

    def vector(self, info: TensorInfo) -> Array:
        return self.cache.get(info)

    def linear(self, x: Array, w: TensorInfo, bias: TensorInfo | None = None, residual: Array | None = None) -> Array:
        y = self._product(x, w)
        if bias is not None:
            y = y + self.cache.get(bias)
        return y if residual is None else residual + y

    def linears(self, x: Array, ws: Sequence[TensorInfo], biases: Sequence[TensorInfo | None]) -> list[Array]:
        return [self.linear(x, w, b) for w, b in zip(ws, biases)]

    def norm_linears(self, x: Array, norm: TensorInfo, eps: float, ws: Sequence[TensorInfo],
                     biases: Sequence[TensorInfo | None]) -> list[Array]:
        return self.linears(self.rms_norm(x, norm, eps), ws, biases)

    def rms_norm(self, x: Array, w: TensorInfo, eps: float) -> Array:
        mean_sq = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
        return (x * (1.0 / np.sqrt(mean_sq + eps)).astype(np.float32)) * self.cache.get(w)

    def rope_neox(self, x: Array, positions: np.ndarray, n_rot: int, base: float, step: Step = RESIDENT) -> Array:
        """Rotate the first n_rot dims of each head, pairing dim i with i + n_rot/2 (NEOX layout)."""
        half = n_rot // 2
        inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
        theta = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # [T, half]
        cos = np.cos(theta).astype(np.float32)[:, None, :]
        sin = np.sin(theta).astype(np.float32)[:, None, :]
        x0, x1 = x[..., :half], x[..., half:n_rot]
        out = x.copy()
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:n_rot] = x0 * sin + x1 * cos
        return out

    def rope_kv_store(self, q: Array, k: Array, v: Array, k_buf: Array, v_buf: Array, positions: np.ndarray,
                      n_rot: int, base: float, step: Step = RESIDENT) -> tuple[Array, Array, Array]:
        k_all, v_all = self.kv_store(k_buf, v_buf, positions, self.rope_neox(k, positions, n_rot, base, step), v, step)
        return self.rope_neox(q, positions, n_rot, base, step), k_all, v_all

    def attention(self, q: Array, k: Array, v: Array, q_positions: np.ndarray, step: Step = RESIDENT) -> Array:
        """Causal GQA attention: q [T, H, D] at q_positions against k, v [S, Hkv, D] -> [T, H*D].

        Small batches go row by row, each against only the positions it sees, so every row has the
        shapes (and reduction lengths) of a single-token decode: batch invariant for T <= SMALL_BATCH_ROWS.
        A float16 cache is widened to float32 before the products (as the CUDA kernels read it); with
        `llama_activations`, q and the softmax weights are also rounded to float16 first, as llama.cpp's
        CPU products with an f16 cache take them (F16's vec_dot_type is F16).
        """
        if 1 < len(q) <= SMALL_BATCH_ROWS:
            return np.concatenate([
                self.attention(np.ascontiguousarray(q[i : i + 1]), k[: int(pos) + 1], v[: int(pos) + 1], q_positions[i : i + 1])
                for i, pos in enumerate(q_positions)
            ])
        round_f16 = self.llama_activations and k.dtype == np.float16
        k, v = _widened(k), _widened(v)
        if round_f16:
            q = _f16_rounded(q)
        n_tok, n_head, dim = q.shape
        group = n_head // k.shape[1]
        kh = np.repeat(k, group, axis=1).transpose(1, 2, 0)  # [H, D, S]
        vh = np.repeat(v, group, axis=1).transpose(1, 0, 2)  # [H, S, D]
        scores = np.matmul(q.transpose(1, 0, 2), kh) * np.float32(1.0 / np.sqrt(dim))  # [H, T, S]
        visible = np.arange(k.shape[0])[None, :] <= q_positions[:, None]  # [T, S]
        scores = np.where(visible[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        if round_f16:
            probs = _f16_rounded(probs)
        return np.matmul(probs, vh).transpose(1, 0, 2).reshape(n_tok, n_head * dim)

    def swiglu(self, gate: Array, up: Array) -> Array:
        return gate / (1.0 + np.exp(-gate)) * up

    def swiglu_ffn(self, x: Array, gate: TensorInfo, up: TensorInfo, down: TensorInfo) -> Array:
        return self.linear(self.swiglu(self.linear(x, gate), self.linear(x, up)), down)

    def concat(self, a: Array, b: Array) -> Array:
        return np.concatenate([a, b], axis=-1)

    def concat_rows(self, parts: Sequence[Array]) -> Array:
        return np.concatenate(list(parts), axis=0)

    # -- mixture of experts -----------------------------------------------------------------------
    def norm_route(self, x: Array, norm: TensorInfo, eps: float, router: TensorInfo, probs_bias: TensorInfo | None,
                   cfg: ModelConfig, beside: bool = False) -> tuple[Array, np.ndarray, Array]:
        h = self.rms_norm(x, norm, eps)
        ids, weights = self.route(self.linear(h, router), probs_bias, cfg)
        return h, ids, weights

    def route(self, logits: Array, probs_bias: TensorInfo | None, cfg: ModelConfig) -> tuple[np.ndarray, Array]:
        """Pick each token's experts: ids [T, k] and their mixing weights [T, k] (llama.cpp's build_moe_ffn)."""
        if cfg.gating == "sigmoid":
            probs = 1.0 / (1.0 + np.exp(-logits))
        else:
            shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
            probs = shifted / shifted.sum(axis=-1, keepdims=True)
        selection = probs + self.cache.get(probs_bias) if probs_bias is not None else probs
        if cfg.n_expert_groups > 1:
            selection = _mask_expert_groups(selection, cfg.n_expert_groups, cfg.n_group_used)
        ids = np.argsort(-selection, axis=-1, kind="stable")[:, : cfg.n_expert_used]
        weights = np.take_along_axis(probs, ids, axis=-1)
        if cfg.expert_weights_norm:
            weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), np.float32(6.103515625e-5))
        if cfg.expert_weights_scale not in (0.0, 1.0):
            weights = weights * np.float32(cfg.expert_weights_scale)
        return ids, weights.astype(np.float32)

    def moe(self, x: Array, ids: np.ndarray, weights: Array, w: MoEWeights, step: Step = RESIDENT,
            with_shared: bool = False, residual: Array | None = None) -> Array:
        """Sum over each token's selected experts of weight * down(silu(gate x) * up x); tokens grouped by expert.

        Each expert is computed from the bytes the step's provider returned for it (dequantized copies
        are cached under the bytes' key, so a slot refilled with another expert is never served stale).
        """
        got = (step.experts or _RESIDENT_EXPERTS).fetch(w, experts_by_recency(ids))
        out = np.zeros_like(x)
        for expert in np.unique(ids):  # ascending, whatever the provider: the sum order stays fixed
            m = got[int(expert)]
            rows, slot = np.nonzero(ids == expert)
            xe = x[rows]
            h = self.swiglu(self._product(xe, m.tensor("gate")), self._product(xe, m.tensor("up")))
            out[rows] += self._product(h, m.tensor("down")) * weights[rows, slot][:, None]
        if with_shared:
            assert w.shared is not None, "with_shared on a MoE layer without a shared expert"
            out = out + self.swiglu_ffn(x, w.shared.gate, w.shared.up, w.shared.down)
        return out if residual is None else residual + out


def _widened(x: Array) -> Array:
    """A float16 cache's rows as float32 (float32 and the tests' float64 twins pass as they are)."""
    return x.astype(np.float32) if x.dtype == np.float16 else x


def _f16_rounded(x: Array) -> Array:
    return x.astype(np.float16).astype(x.dtype)


def _mask_expert_groups(selection: Array, n_groups: int, n_used: int) -> Array:
    """Keep only the n_used groups whose two best experts score highest (DeepSeek-V3 group routing)."""
    n_tok, n_expert = selection.shape
    groups = selection.reshape(n_tok, n_groups, n_expert // n_groups)
    group_score = np.sort(groups, axis=-1)[..., -2:].sum(axis=-1)  # [T, G]
    keep = np.argsort(-group_score, axis=-1, kind="stable")[:, :n_used]
    mask = np.zeros((n_tok, n_groups), dtype=bool)
    np.put_along_axis(mask, keep, True, axis=-1)
    return np.where(mask[..., None], groups, -np.inf).reshape(n_tok, n_expert)
