"""When a prompt is worth the phase transaction: its fixed cost against what it buys.

Without the transaction a prompt tail runs through the expert cache in decode-sized batches: every
routed expert the cache misses is uploaded on demand, at the small (server) micro-batch's compute
rate. With it, the cache is released, the prompt streams whole expert sets through staging at the
large (prefill) micro-batch, and the slots are restored (warm: refilled) before the first token:

    seconds_with    = fixed_s + bytes_with_phase / h2d_bytes_per_s + tokens / tok_s_large
    seconds_without =           bytes_without_phase / h2d_bytes_per_s + tokens / tok_s_small
                              + forwards_without * forward_s

and the transaction runs when seconds_with < seconds_without. `fixed_s` is release + restore +
graph recapture; the rate terms default to infinite (unmeasured), so bytes, the fixed cost and the
forwards decide. `forward_s` is what the engine measured one decode step to take: a prompt through
the cache runs one forward per few tokens, each at least a decode step (one host sync per MoE
layer), which bytes alone miss. On the 48-layer seed shape, bytes alone (costed at decode's 97%
hit rate) sent a 1k prompt through the cache: 128 forwards of 8 tokens, each at least a decode
step (15 ms there), so at least 2 s, where the transaction's TTFT at 2k was 0.9 s. A chat turn of
a few dozen tokens misses fewer expert bytes than one expert set and needs a handful of forwards,
so it skips the transaction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PromptCost:
    tokens: int
    bytes_with_phase: int  # expert set bytes x crossings, plus the warm refill
    bytes_without_phase: int  # what the expert cache would upload on misses
    forwards_without: int = 0  # forwards through the cache the prompt would take
    forward_s: float = 0.0  # seconds per such forward, at least: a measured decode step (0: none yet)


@dataclass(frozen=True)
class PhaseCostModel:
    fixed_s: float = 0.02
    h2d_bytes_per_s: float = 55e9  # pinned host-to-device, measured on the H200 box
    tok_s_small: float = math.inf  # prefill compute rate at the server micro-batch (pending measurement)
    tok_s_large: float = math.inf  # ... at the prefill micro-batch

    def seconds_with(self, c: PromptCost) -> float:
        return self.fixed_s + c.bytes_with_phase / self.h2d_bytes_per_s + c.tokens / self.tok_s_large

    def seconds_without(self, c: PromptCost) -> float:
        return (c.bytes_without_phase / self.h2d_bytes_per_s + c.tokens / self.tok_s_small
                + c.forwards_without * c.forward_s)

    def pays(self, c: PromptCost) -> bool:
        return self.seconds_with(c) < self.seconds_without(c)
