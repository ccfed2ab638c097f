"""The glm4moe NextN (MTP) block: predicts the token after next from a hidden state and the next token.

Follows llama.cpp's graph_mtp: h' = eh_proj(concat(enorm(embed(token)), hnorm(hidden))), one decoder
layer (attention + MoE + shared expert) with its own KV cache, then the shared head. The hidden it
returns is the head-normed state, the same kind of state the trunk hands it, so calls chain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from runner.backends.step import RESIDENT, Step
from runner.engine.kv_cache import KVCache
from runner.models.config import ModelConfig
from runner.models.transformer import decoder_layer
from runner.models.weights import NextNWeights

if TYPE_CHECKING:
    from runner.backends.ops import Ops


class NextNBlock:
    def __init__(self, cfg: ModelConfig, weights: NextNWeights, ops: Ops):
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
        x = self.layer(x, positions, kv, step)
        kv.advance(len(tokens))
        out_hidden = ops.rms_norm(x, w.head_norm, cfg.rms_eps)
        return ops.linear(out_hidden, w.head), out_hidden

    def layer(self, x: Any, positions: np.ndarray, kv: KVCache, step: Step) -> Any:
        """The block's one decoder layer, with its one K/V slot (0)."""
        return decoder_layer(self.ops, self.cfg, self.weights.layer, x, positions, kv, 0, step)
