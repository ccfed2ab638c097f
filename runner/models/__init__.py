"""Forward passes, one definition per architecture family, written against an ops backend."""

from runner.models.nextn import NextNBlock
from runner.models.transformer import MoETransformer

__all__ = ["MoETransformer", "NextNBlock"]
