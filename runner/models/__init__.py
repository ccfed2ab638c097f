"""Forward passes, one definition per architecture family, written against an ops backend."""

from .moe_transformer import MoETransformer
from .nextn import NextNBlock

__all__ = ["MoETransformer", "NextNBlock"]
