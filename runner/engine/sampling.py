"""Token selection from logits: greedy, or llama.cpp's chain top-k -> top-p -> min-p -> temperature."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from runner.errors import GenerationError


class NonFiniteLogits(GenerationError):
    """The model produced NaN or infinite logits: its weights or metadata are broken, not the request."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8  # <= 0 means greedy
    top_k: int = 40  # <= 0 keeps every token
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    presence_penalty: float = 0.0  # OpenAI semantics, over the tokens generated so far
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0  # llama.cpp's, over the tokens generated so far; 1 is off

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise GenerationError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.seed is not None and self.seed < 0:
            raise GenerationError(f"seed must be >= 0, got {self.seed}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise GenerationError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not self.repeat_penalty > 0.0:
            raise GenerationError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if not 0.0 < self.top_p <= 1.0:
            raise GenerationError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise GenerationError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.temperature < 0:
            raise GenerationError(f"temperature must be >= 0, got {self.temperature}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """The distribution the sampler draws from: zero outside the kept candidates."""
        p = self.params
        logits = np.asarray(logits, dtype=np.float64)
        check_finite(logits)  # a NaN would otherwise crash numpy's choice, or pick garbage
        order = np.argsort(-logits, kind="stable")
        if p.top_k > 0:
            order = order[: p.top_k]
        probs = _softmax(logits[order])
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            order, probs = order[:keep], probs[:keep]
        if p.min_p > 0.0:
            keep_mask = probs >= p.min_p * probs[0]
            order = order[keep_mask]
        kept = logits[order]
        final = _softmax((kept - kept.max()) / p.temperature)  # shift first: a tiny temperature overflows
        out = np.zeros_like(logits)
        out[order] = final
        return out

    def __call__(self, logits: np.ndarray) -> int:
        if self.params.greedy:
            check_finite(logits)  # argmax takes the first NaN as the maximum
            return int(np.argmax(logits))
        probs = self.probabilities(logits)
        return int(self.rng.choice(len(probs), p=probs))


def check_finite(logits: np.ndarray) -> None:
    """NonFiniteLogits unless every logit is a finite number (the caller adds where in the sequence)."""
    if not np.isfinite(logits).all():
        raise NonFiniteLogits("the model produced non-finite logits (NaN or infinity)")


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()
