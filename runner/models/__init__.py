"""Forward passes, one definition per architecture family, written against an ops backend."""

from typing import Any

from runner.models.config import ModelConfig
from runner.models.hybrid import HybridNextN, HybridTransformer
from runner.models.nextn import NextNBlock
from runner.models.transformer import MoETransformer
from runner.models.weights import ModelWeights, NextNWeights

__all__ = ["HybridNextN", "HybridTransformer", "MoETransformer", "NextNBlock", "nextn_for", "trunk_for"]


def trunk_for(cfg: ModelConfig, weights: ModelWeights, ops: Any) -> MoETransformer | HybridTransformer:
    """The family's forward pass: hybrid DeltaNet/attention layers, or the attention transformer."""
    return HybridTransformer(cfg, weights, ops) if cfg.family.hybrid else MoETransformer(cfg, weights, ops)


def nextn_for(cfg: ModelConfig, weights: NextNWeights, ops: Any) -> NextNBlock | HybridNextN:
    return HybridNextN(cfg, weights, ops) if cfg.family.hybrid else NextNBlock(cfg, weights, ops)
