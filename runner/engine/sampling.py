"""Token selection from logits: greedy, or llama.cpp's chain top-k -> top-p -> min-p -> temperature, over
the tokens a grammar allows when the request is constrained."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from runner.engine.grammar import Grammar
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
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias) added to its logit before the penalties
    grammar: Grammar | None = field(default=None, compare=False)  # only tokens it allows are drawn

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise GenerationError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.seed is not None and self.seed < 0:
            raise GenerationError(f"seed must be >= 0, got {self.seed}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise GenerationError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        for token, bias in self.logit_bias:
            if token < 0 or not -100.0 <= bias <= 100.0:
                raise GenerationError(f"logit_bias: token {token} must be >= 0 and its bias in [-100, 100], "
                                      f"got {bias}")
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
    """One generation's token selection: its random stream and, when constrained, where it is in the grammar.

    `ahead` (MTP drafts, not yet committed) asks about the position after those tokens; `accept` commits
    a token the generation keeps.
    """

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.grammar = params.grammar.start() if params.grammar is not None else None

    @property
    def done(self) -> bool:
        """A grammar constrains the output and is complete: the generation ends here."""
        return self.grammar is not None and self.grammar.done

    def accept(self, token: int) -> None:
        if self.grammar is not None:
            self.grammar.accept(token)

    def constrained(self, logits: np.ndarray, ahead: Sequence[int] = ()) -> np.ndarray:
        """`logits` (checked finite) with every token the grammar forbids after `ahead` at -inf."""
        check_finite(logits)  # a NaN would otherwise crash numpy's choice, or pick garbage
        if self.grammar is None:
            return logits
        allowed = self.grammar.allowed(ahead)
        out = np.full(len(logits), -np.inf, dtype=np.float64)
        n = min(len(allowed), len(logits))  # a model may have more logit rows than its vocabulary has tokens
        out[:n] = np.where(allowed[:n], logits[:n], -np.inf)
        return out

    def probabilities(self, logits: np.ndarray, ahead: Sequence[int] = ()) -> np.ndarray:
        """The distribution the sampler draws from: zero outside the kept candidates."""
        p = self.params
        logits = self.constrained(np.asarray(logits, dtype=np.float64), ahead)
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

    def __call__(self, logits: np.ndarray, ahead: Sequence[int] = ()) -> int:
        if self.params.greedy:
            return int(np.argmax(self.constrained(logits, ahead)))  # checked first: argmax takes a NaN as the maximum
        probs = self.probabilities(logits, ahead)
        return int(self.rng.choice(len(probs), p=probs))


def check_finite(logits: np.ndarray) -> None:
    """NonFiniteLogits unless every logit is a finite number (the caller adds where in the sequence)."""
    if not np.isfinite(logits).all():
        raise NonFiniteLogits("the model produced non-finite logits (NaN or infinity)")


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()
