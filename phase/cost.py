"""When a prompt is worth the phase transaction: its fixed cost against what it buys.

Without the transaction a prompt tail runs through the expert cache in decode-sized batches: every
routed expert the cache misses is uploaded on demand, at the small (server) micro-batch's compute
rate. With it, the cache is released, the prompt streams whole expert sets through staging at the
large (prefill) micro-batch, and the slots are restored (warm: refilled) before the first token:

    seconds_with    = fixed_s + bytes_with_phase / h2d_bytes_per_s + tokens / tok_s_large
    seconds_without =           bytes_without_phase / h2d_bytes_per_s + tokens / tok_s_small

and the transaction runs when seconds_with < seconds_without. `fixed_s` is release + restore +
graph recapture; the defaults are estimates until measured on the box (the compute terms default
to zero, so only bytes and the fixed cost decide). A chat turn of a few dozen tokens misses fewer
expert bytes than one expert set, so it skips the transaction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PromptCost:
    tokens: int
    bytes_with_phase: int  # expert set bytes x crossings, plus the warm refill
    bytes_without_phase: int  # what the expert cache would upload on misses


@dataclass(frozen=True)
class PhaseCostModel:
    fixed_s: float = 0.02
    h2d_bytes_per_s: float = 55e9  # pinned host-to-device, measured on the H200 box
    tok_s_small: float = math.inf  # prefill compute rate at the server micro-batch (pending measurement)
    tok_s_large: float = math.inf  # ... at the prefill micro-batch

    def seconds_with(self, c: PromptCost) -> float:
        return self.fixed_s + c.bytes_with_phase / self.h2d_bytes_per_s + c.tokens / self.tok_s_large

    def seconds_without(self, c: PromptCost) -> float:
        return c.bytes_without_phase / self.h2d_bytes_per_s + c.tokens / self.tok_s_small

    def pays(self, c: PromptCost) -> bool:
        return self.seconds_with(c) < self.seconds_without(c)
