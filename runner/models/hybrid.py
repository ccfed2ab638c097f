"""The forward pass of the hybrid linear-attention families (qwen35moe, qwen3next) and their MTP block.

MoETransformer and NextNBlock (transformer.py, nextn.py) with the hybrid layers' halves swapped in, so
the engine, offload and MTP drafting run either; the sequence cache is a HybridCache (attention K/V
plus DeltaNet state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from runner.backends.step import Step
from runner.engine.hybrid_cache import (
    PERIODIC_DEFAULT,
    HybridCache,
    PeriodicCheckpoints,
)
from runner.engine.kv_cache import KVCache
from runner.errors import ModelFileError
from runner.models.config import ModelConfig
from runner.models.hybrid_layers import hybrid_ffn_block, hybrid_layer, mixer_block
from runner.models.nextn import NextNBlock
from runner.models.transformer import MoETransformer
from runner.models.weights import ModelWeights, NextNWeights

if TYPE_CHECKING:
    from runner.backends.hybrid_ops import HybridOps


def _check_backend(cfg: ModelConfig, ops: Any) -> None:
    # imported here: backends/ops.py imports runner.models, which imports this module
    from runner.backends.hybrid_ops import supports_hybrid

    if not supports_hybrid(ops):
        raise ModelFileError(f"the {ops.name} backend does not run {cfg.arch} (Gated DeltaNet) yet; "
                             f"use --backend numpy")


class HybridTransformer(MoETransformer):
    """MoETransformer with the hybrid layers' halves: Gated DeltaNet or gated attention to mix tokens, the
    routed experts plus the gated shared expert after; the sequence cache is a HybridCache."""

    MIXER_OVER_GROUPS = False  # the DeltaNet state steps chunk by chunk (its prompt kernels are per micro-batch)

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, ops: HybridOps):
        _check_backend(cfg, ops)
        super().__init__(cfg, weights, ops)

    def new_kv_cache(self, n_ctx: int, periodic: PeriodicCheckpoints = PERIODIC_DEFAULT) -> HybridCache:
        """The sequence cache; `periodic` says where long prompts leave host-RAM checkpoints of the state."""
        return HybridCache(self.ops, self.cfg, n_ctx, periodic=periodic)

    def mixer(self, i: int, x: Any, positions: np.ndarray, kv: Any, step: Step, with_residual: bool = False) -> Any:
        """Layer i's DeltaNet (its state runs through the chunks in order) or gated attention (with_residual: x +
        it, added here)."""
        out = mixer_block(self.ops, self.cfg, self.weights.layers[i], x, positions, kv, i, step)
        return x + out if with_residual else out

    def ffn(self, i: int, x: Any, step: Step, positions: np.ndarray | None = None, with_residual: bool = False) -> Any:
        out = hybrid_ffn_block(self.ops, self.cfg, self.weights.layers[i], x, step, self.pick(i, step, positions))
        return x + out if with_residual else out  # the gated shared expert is added outside the experts' op

    def discard(self, kv: Any) -> None:
        """A layer-major prompt given up midway: the DeltaNet layers already run go back to their states."""
        kv.discard()


class HybridNextN(NextNBlock):
    """The MTP block with a gated-attention MoE layer (llama.cpp's graph_mtp of both hybrid families)."""

    def __init__(self, cfg: ModelConfig, weights: NextNWeights, ops: HybridOps):
        _check_backend(cfg, ops)
        super().__init__(cfg, weights, ops)

    def layer(self, x: Any, positions: np.ndarray, kv: KVCache, step: Step) -> Any:
        return hybrid_layer(self.ops, self.cfg, self.weights.layer, x, positions, kv, 0, step)
