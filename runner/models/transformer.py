"""The forward pass shared by glm4moe and qwen3moe, written against an ops backend.

The two families differ only in data the config and weights carry (qkv bias, q/k norm, partial
rotary, leading dense layers, sigmoid vs softmax routing, shared expert), so one definition serves
both, and the NextN block reuses `decoder_layer`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from runner.backends.limits import SMALL_BATCH_ROWS
from runner.backends.step import RESIDENT, Step
from runner.engine.kv_cache import KVCache
from runner.gguf_file import TensorInfo
from runner.models.config import ModelConfig
from runner.models.weights import FFNWeights, LayerWeights, ModelWeights, MoEWeights

if TYPE_CHECKING:
    from runner.backends.ops import Ops


def attention_block(ops: Ops, cfg: ModelConfig, lw: LayerWeights, x: Any, positions: np.ndarray,
                    kv: KVCache, layer_slot: int, step: Step, with_residual: bool = False) -> Any:
    """Pre-normed self-attention with GQA, optional q/k RMSNorm and NEOX rotary on the first n_rot dims;
    `with_residual`: x + that, added by the output projection's op (CUDA decode: in the GEMV's launch)."""
    a = lw.attn
    n_tok = x.shape[0]
    # the norm and the three products: one launch at decode sizes on CUDA
    q, k, v = ops.norm_linears(x, lw.attn_norm, cfg.rms_eps, (a.wq, a.wk, a.wv), (a.bq, a.bk, a.bv))
    q = q.reshape(n_tok, cfg.n_head, cfg.head_dim)
    k = k.reshape(n_tok, cfg.n_head_kv, cfg.head_dim)
    v = v.reshape(n_tok, cfg.n_head_kv, cfg.head_dim)
    if a.q_norm is not None:
        q = ops.rms_norm(q, a.q_norm, cfg.rms_eps)
    if a.k_norm is not None:
        k = ops.rms_norm(k, a.k_norm, cfg.rms_eps)
    q, k_all, v_all = kv.store_roped(layer_slot, positions, q, k, v, cfg.n_rot, cfg.rope_base, step)
    return ops.linear(ops.attention(q, k_all, v_all, positions, step), a.wo, residual=x if with_residual else None)


def dense_ffn(ops: Ops, w: FFNWeights, x: Any, residual: Any = None) -> Any:
    out = ops.swiglu_ffn(x, w.gate, w.up, w.down)
    return out if residual is None else residual + out


def moe_ffn(ops: Ops, cfg: ModelConfig, w: MoEWeights, norm: TensorInfo, x: Any, step: Step,
            pick: Callable[[Any], Any] | None = None, residual: Any = None) -> Any:
    """Routed experts (top-k of the router) of rms_norm(x, norm) plus the shared expert when the model has one, plus
    `residual` when given (the layer's skip connection, in the same op); `pick(ids)`, when given, replaces the
    router's ids (benchmarks' synthetic routing), its weights kept in order."""
    # [T, n_embd], [T, k], [T, k]: the norm, the router's product and its top-k, one launch at decode sizes on CUDA
    h, ids, weights = ops.norm_route(x, norm, cfg.rms_eps, w.router, w.probs_bias, cfg)
    if pick is not None:
        ids = pick(ids)
    # the step's expert provider finds the experts; the shared expert is added after them (one op, so CUDA can
    # run it as one more pair of the routed experts' launches)
    return ops.moe(h, ids, weights, w, step, with_shared=w.shared is not None, residual=residual)


def ffn_block(ops: Ops, cfg: ModelConfig, lw: LayerWeights, x: Any, step: Step,
              pick: Callable[[Any], Any] | None = None, with_residual: bool = False) -> Any:
    """The pre-normed feed-forward half of a layer (routed experts or a dense FFN); `with_residual`: x + that,
    the sum in the experts' last op (CUDA decode: their combine launch adds x, one launch fewer a layer)."""
    residual = x if with_residual else None
    if isinstance(lw.ffn, MoEWeights):
        return moe_ffn(ops, cfg, lw.ffn, lw.ffn_norm, x, step, pick, residual)
    return dense_ffn(ops, lw.ffn, ops.rms_norm(x, lw.ffn_norm, cfg.rms_eps), residual)


def decoder_layer(ops: Ops, cfg: ModelConfig, lw: LayerWeights, x: Any, positions: np.ndarray,
                  kv: KVCache, layer_slot: int, step: Step = RESIDENT) -> Any:
    x = attention_block(ops, cfg, lw, x, positions, kv, layer_slot, step, with_residual=True)
    return ffn_block(ops, cfg, lw, x, step, with_residual=True)


def token_groups(sizes: Sequence[int], group_tokens: int) -> list[list[int]]:
    """Consecutive chunks (by index) gathered into groups of at most group_tokens rows, one chunk at least.

    A chunk of at most SMALL_BATCH_ROWS rows stays alone: such a batch takes the backends' small-batch
    kernels, so grouping it with others would change its bits."""
    groups: list[list[int]] = []
    total = 0
    for i, n in enumerate(sizes):
        if groups and total + n <= group_tokens and n > SMALL_BATCH_ROWS and total > SMALL_BATCH_ROWS:
            groups[-1].append(i)
            total += n
        else:
            groups.append([i])
            total = n
    return groups


class MoETransformer:
    """Token ids in, logits and the final normed hidden state out, one batch of new positions at a time."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, ops: Ops):
        self.cfg = cfg
        self.weights = weights
        self.ops = ops
        self.routing: Any = None  # benchmarks' synthetic routing (offload/synthetic_routing.py); None: the router's

    def new_kv_cache(self, n_ctx: int) -> KVCache:
        return KVCache(self.ops, self.cfg.n_layer, n_ctx, self.cfg.n_head_kv, self.cfg.head_dim)

    def forward(self, tokens: np.ndarray, kv: Any, all_logits: bool = False,
                before_layer: Callable[[int], None] | None = None,
                after_layer: Callable[[int], None] | None = None, step: Step = RESIDENT) -> tuple[Any, Any]:
        """Run `tokens` at the next positions of `kv`; logits [T or 1, vocab] and normed hidden [T, n_embd].

        `before_layer(i)` is called before layer i runs (prefill streaming stages its experts there),
        `after_layer(i)` once its work is enqueued (the stream timeline closes its compute span);
        `step` says where the routed experts come from and whether a decode graph is recording.
        """
        ops, w = self.ops, self.weights
        positions = kv.positions(len(tokens))
        x = ops.embed(w.token_embd, np.asarray(tokens), step)
        for i in range(len(w.layers)):
            if before_layer is not None:
                before_layer(i)
            x = self.mixer(i, x, positions, kv, step, with_residual=True)
            x = self.ffn(i, x, step, positions, with_residual=True)
            if after_layer is not None:
                after_layer(i)
        kv.advance(len(tokens))
        return self.head(x, all_logits)

    # A layer-major prompt's attention may run over a feed-forward group of chunks at once (layer_over_chunks).
    MIXER_OVER_GROUPS = True

    def mixer(self, i: int, x: Any, positions: np.ndarray, kv: Any, step: Step, with_residual: bool = False) -> Any:
        """Layer i's token-mixing half (self-attention here); with_residual: x + it, in one op where the backend
        can."""
        return attention_block(self.ops, self.cfg, self.weights.layers[i], x, positions, kv, i, step, with_residual)

    def ffn(self, i: int, x: Any, step: Step, positions: np.ndarray | None = None, with_residual: bool = False) -> Any:
        """Layer i's feed-forward half (with_residual: x + it, in one op where the backend can); `positions` of
        its rows for synthetic routing."""
        depth = getattr(step.graph, "prefetch_depth", 0)
        if depth and self.routing is None:  # synthetic routing replaces the router's ids: nothing to guess
            self.stage_next_guesses(i, x, step.graph, depth)
        return ffn_block(self.ops, self.cfg, self.weights.layers[i], x, step, self.pick(i, step, positions),
                         with_residual)

    def stage_next_guesses(self, i: int, x: Any, graph: Any, depth: int) -> None:
        """Hand `graph` (a directory decode graph that prefetches) the next MoE layer's `depth` likeliest experts for
        these rows: its norm and router applied to x, layer i's feed-forward input, a layer before its own input
        exists (docs/perf/2026-12-07e-pregate-prediction-cpu.md). Nothing after the last MoE layer."""
        layers = self.weights.layers
        nxt = next((j for j in range(i + 1, len(layers)) if isinstance(layers[j].ffn, MoEWeights)), None)
        if nxt is None or not isinstance(layers[i].ffn, MoEWeights):
            return
        lw = layers[nxt]
        cfg = dataclasses.replace(self.cfg, n_expert_used=depth)

        def guess(out: Any) -> None:  # enqueued where the graph says (CUDA: a stream of its own, `beside` the router)
            out[...] = self.ops.norm_route(x, lw.ffn_norm, cfg.rms_eps, lw.ffn.router, lw.ffn.probs_bias, cfg,
                                           beside=True)[1]

        graph.stage_guesses(lw.ffn, guess)

    def pick(self, i: int, step: Step, positions: np.ndarray | None) -> Callable[[Any], Any] | None:
        """Layer i's router ids -> synthetic routing's for these positions (None: keep the router's). Inside a
        decode or verify graph the positions are the graph's device buffer, so one graph serves every position."""
        if self.routing is None:
            return None
        device_position = step.graph.position if step.graph is not None else None
        return lambda ids: self.routing.ids_for(i, ids, positions, device_position)

    def discard(self, kv: Any) -> None:
        """A layer-major prompt given up midway: K/V past n_tokens is ignored anyway, nothing to undo."""

    def head(self, x: Any, all_logits: bool = False) -> tuple[Any, Any]:
        hidden = self.ops.rms_norm(x, self.weights.output_norm, self.cfg.rms_eps)
        logits = self.ops.linear(hidden if all_logits else hidden[-1:], self.weights.output)
        return logits, hidden

    def layer_over_chunks(self, i: int, xs: list[Any], positions: list[np.ndarray], kv: Any,
                          step: Step = RESIDENT, group_tokens: int = 0) -> list[Any]:
        """Layer i over every chunk of a prompt, in groups of consecutive chunks of up to group_tokens rows
        (0: each chunk alone): a group's tokens go through each routed expert in one product, and through
        attention in one call when MIXER_OVER_GROUPS (its K/V stored first, each row masked to the keys at
        or before it, as chunk by chunk; on a backend whose prompt kernels are row-invariant, the same bits).
        Otherwise each chunk attends on its own first (chunk c to chunks 0..c of this layer)."""
        if not self.MIXER_OVER_GROUPS:
            xs = [self.mixer(i, x, p, kv, step, with_residual=True) for x, p in zip(xs, positions)]
        out: list[Any] = []
        for group in token_groups([len(x) for x in xs], group_tokens):
            x = xs[group[0]] if len(group) == 1 else self.ops.concat_rows([xs[c] for c in group])
            rows = positions[group[0]] if len(group) == 1 else np.concatenate([positions[c] for c in group])
            if self.MIXER_OVER_GROUPS:
                x = self.mixer(i, x, rows, kv, step, with_residual=True)
            # positions only for synthetic routing: none on the usual path
            y = self.ffn(i, x, step, rows if self.routing is not None else None, with_residual=True)
            bounds = np.cumsum([0, *(len(xs[c]) for c in group)])
            out += [y[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        return out

    def forward_layer_major(self, chunks: Sequence[np.ndarray], kv: Any, all_logits: bool = False,
                            before_layer: Callable[[int], None] | None = None,
                            cancelled: Callable[[], bool] | None = None,
                            after_layer: Callable[[int], None] | None = None,
                            step: Step = RESIDENT,
                            group_tokens: int = 0) -> list[tuple[Any, Any]] | None:
        """Every chunk through layer 0, then every chunk through layer 1, ...; per chunk what forward() gives.

        Each layer's feed-forward half runs over groups of chunks (up to group_tokens rows; 0: chunk by
        chunk) at once; the results equal forward() chunk by chunk bit for bit when each chunk is its
        own group, and with groups wherever the backend's products are row-invariant (CUDA's prompt
        kernels are; numpy's BLAS products are not, and agree to float32 rounding). `cancelled` is asked
        between layers; on yes nothing of these chunks is kept.
        """
        ops, w = self.ops, self.weights
        all_positions = kv.positions(sum(len(c) for c in chunks))
        bounds = np.cumsum([0, *(len(c) for c in chunks)])
        positions = [all_positions[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        xs = [ops.embed(w.token_embd, np.asarray(c), step) for c in chunks]
        for i in range(len(w.layers)):
            if cancelled is not None and cancelled():
                self.discard(kv)
                return None
            if before_layer is not None:
                before_layer(i)
            xs = self.layer_over_chunks(i, xs, positions, kv, step, group_tokens)
            if after_layer is not None:
                after_layer(i)
        kv.advance(int(bounds[-1]))
        return [self.head(x, all_logits) for x in xs]
