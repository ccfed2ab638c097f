"""The forward pass of the hybrid linear-attention families (qwen35moe, qwen3next) and their MTP block.

The same interface as MoETransformer / NextNBlock (transformer.py, nextn.py), so the engine, sampling
and MTP drafting use either; the sequence cache is a HybridCache (attention K/V plus DeltaNet state).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from runner.backends.step import RESIDENT, Step
from runner.engine.hybrid_cache import (
    PERIODIC_DEFAULT,
    HybridCache,
    PeriodicCheckpoints,
)
from runner.engine.kv_cache import KVCache
from runner.errors import ModelFileError
from runner.models.config import ModelConfig
from runner.models.hybrid_layers import hybrid_ffn_block, hybrid_layer, mixer_block
from runner.models.transformer import token_groups
from runner.models.weights import ModelWeights, NextNWeights

if TYPE_CHECKING:
    from runner.backends.hybrid_ops import HybridOps


def _check_backend(cfg: ModelConfig, ops: Any) -> None:
    # imported here: backends/ops.py imports runner.models, which imports this module
    from runner.backends.hybrid_ops import supports_hybrid

    if not supports_hybrid(ops):
        raise ModelFileError(f"the {ops.name} backend does not run {cfg.arch} (Gated DeltaNet) yet; "
                             f"use --backend numpy")


class HybridTransformer:
    """Token ids in, logits and the final normed hidden state out, one batch of new positions at a time."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, ops: HybridOps):
        _check_backend(cfg, ops)
        self.cfg = cfg
        self.weights = weights
        self.ops = ops

    def new_kv_cache(self, n_ctx: int, periodic: PeriodicCheckpoints = PERIODIC_DEFAULT) -> HybridCache:
        """The sequence cache; `periodic` says where long prompts leave host-RAM checkpoints of the state."""
        return HybridCache(self.ops, self.cfg, n_ctx, periodic=periodic)

    def forward(self, tokens: np.ndarray, kv: HybridCache, all_logits: bool = False,
                before_layer: Callable[[int], None] | None = None,
                after_layer: Callable[[int], None] | None = None, step: Step = RESIDENT) -> tuple[Any, Any]:
        """Run `tokens` at the next positions of `kv`; logits [T or 1, vocab] and normed hidden [T, n_embd]."""
        ops, cfg, w = self.ops, self.cfg, self.weights
        positions = kv.positions(len(tokens))
        x = ops.embed(w.token_embd, np.asarray(tokens), step)
        for i, lw in enumerate(w.layers):
            if before_layer is not None:
                before_layer(i)
            x = hybrid_layer(ops, cfg, lw, x, positions, kv, i, step)
            if after_layer is not None:
                after_layer(i)
        kv.advance(len(tokens))
        return self.head(x, all_logits)

    def head(self, x: Any, all_logits: bool = False) -> tuple[Any, Any]:
        hidden = self.ops.rms_norm(x, self.weights.output_norm, self.cfg.rms_eps)
        logits = self.ops.linear(hidden if all_logits else hidden[-1:], self.weights.output)
        return logits, hidden

    def layer_over_chunks(self, i: int, xs: list[Any], positions: list[np.ndarray], kv: HybridCache,
                          step: Step = RESIDENT, group_tokens: int = 0) -> list[Any]:
        """Layer i over every chunk of a prompt: the mixer chunk by chunk, in order (attention sees chunks
        0..c, a DeltaNet layer's state runs through them), then the feed-forward half over groups of
        consecutive chunks of up to group_tokens rows (0: each chunk alone), as MoETransformer's."""
        ops, cfg, lw = self.ops, self.cfg, self.weights.layers[i]
        xs = [x + mixer_block(ops, cfg, lw, x, p, kv, i, step) for x, p in zip(xs, positions)]
        out: list[Any] = []
        for group in token_groups([len(x) for x in xs], group_tokens):
            x = xs[group[0]] if len(group) == 1 else ops.concat_rows([xs[c] for c in group])
            y = x + hybrid_ffn_block(ops, cfg, lw, x, step)
            bounds = np.cumsum([0, *(len(xs[c]) for c in group)])
            out += [y[a:b] for a, b in pairwise(bounds)]
        return out

    def forward_layer_major(self, chunks: Sequence[np.ndarray], kv: HybridCache, all_logits: bool = False,
                            before_layer: Callable[[int], None] | None = None,
                            cancelled: Callable[[], bool] | None = None,
                            after_layer: Callable[[int], None] | None = None,
                            step: Step = RESIDENT, group_tokens: int = 0) -> list[tuple[Any, Any]] | None:
        """Every chunk through layer 0, then every chunk through layer 1, ...; per chunk what forward() gives
        (the same bits when each chunk is its own feed-forward group). `cancelled` is asked between layers;
        on yes nothing of these chunks is kept: the DeltaNet layers already run go back to their states."""
        ops, w = self.ops, self.weights
        all_positions = kv.positions(sum(len(c) for c in chunks))
        bounds = np.cumsum([0, *(len(c) for c in chunks)])
        positions = [all_positions[a:b] for a, b in pairwise(bounds)]
        xs = [ops.embed(w.token_embd, np.asarray(c), step) for c in chunks]
        for i in range(len(w.layers)):
            if cancelled is not None and cancelled():
                kv.discard()
                return None
            if before_layer is not None:
                before_layer(i)
            xs = self.layer_over_chunks(i, xs, positions, kv, step, group_tokens)
            if after_layer is not None:
                after_layer(i)
        kv.advance(int(bounds[-1]))
        return [self.head(x, all_logits) for x in xs]


class HybridNextN:
    """The MTP block: h' = eh_proj(concat(enorm(embed(token)), hnorm(hidden))), one gated-attention MoE
    layer with its own K/V, then the head norm and head (llama.cpp's graph_mtp of both families)."""

    def __init__(self, cfg: ModelConfig, weights: NextNWeights, ops: HybridOps):
        _check_backend(cfg, ops)
        self.cfg = cfg
        self.weights = weights
        self.ops = ops

    def new_kv_cache(self, n_ctx: int) -> KVCache:
        return KVCache(self.ops, 1, n_ctx, self.cfg.n_head_kv, self.cfg.head_dim)

    def forward(self, hidden: Any, tokens: np.ndarray, kv: KVCache, step: Step = RESIDENT) -> tuple[Any, Any]:
        """hidden [T, n_embd] (state at position p) and tokens [T] (token at p+1) -> logits [T, vocab], hidden."""
        ops, cfg, w = self.ops, self.cfg, self.weights
        positions = kv.positions(len(tokens))
        e = ops.rms_norm(ops.embed(w.embed, np.asarray(tokens), step), w.enorm, cfg.rms_eps)
        h = ops.rms_norm(hidden, w.hnorm, cfg.rms_eps)
        x = ops.linear(ops.concat(e, h), w.eh_proj)
        x = hybrid_layer(ops, cfg, w.layer, x, positions, kv, 0, step)  # its one K/V slot: 0
        kv.advance(len(tokens))
        out_hidden = ops.rms_norm(x, w.head_norm, cfg.rms_eps)
        return ops.linear(out_hidden, w.head), out_hidden

