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


NON_FINITE = "the model produced non-finite logits (NaN or infinity)"


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
        order, final = self._kept(logits, ahead)
        out = np.zeros(len(logits), dtype=np.float64)
        out[order] = final
        return out

    def _kept(self, logits: np.ndarray, ahead: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The candidates llama.cpp's chain keeps (top-k, top-p, min-p) and their probabilities at temperature."""
        # float32 logits stay float32 for the selection (their order is their float64 values' order); the
        # candidates' values are taken in float64
        logits = self.constrained(np.asarray(logits), ahead)
        order, probs = _candidates(logits, self.params)
        return self._cut(order, probs, logits[order])

    def _cut(self, order: np.ndarray, probs: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Top-p and min-p over candidates best first (`values` their logits), then the kept ones' probabilities
        at temperature."""
        p = self.params
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            order, probs, values = order[:keep], probs[:keep], values[:keep]
        if p.min_p > 0.0:
            keep_mask = probs >= p.min_p * probs[0]
            order, values = order[keep_mask], values[keep_mask]
        kept = values.astype(np.float64)
        return order, _softmax((kept - kept.max()) / p.temperature)  # shift first: a tiny temperature overflows

    def __call__(self, logits: np.ndarray, ahead: Sequence[int] = ()) -> int:
        if self.params.greedy:
            return int(np.argmax(self.constrained(logits, ahead)))  # checked first: argmax takes a NaN as the maximum
        return self._draw(*self._kept(logits, ahead))

    def from_top_k(self, ids: np.ndarray, values: np.ndarray) -> int:
        """What __call__ draws from logits whose top_k best are `ids` (best first, ties by id: best_first's order)
        with float32 `values`, the rest of the row unseen: the same candidates, probabilities and random draw.
        Only for an unconstrained, sampled request with 0 < top_k < the row's length (plain_top_k)."""
        assert not self.params.greedy and self.grammar is None and len(ids) == self.params.top_k > 0
        return self._draw(*self._cut(ids, _softmax(values.astype(np.float64)), values))

    def _draw(self, order: np.ndarray, final: np.ndarray) -> int:
        # Drawn over the candidates in vocabulary order: the token a draw over the whole vocabulary (zeros
        # elsewhere) would give from the same random number, without a cumulative sum over all of it.
        by_id = np.argsort(order, kind="stable")
        return int(order[by_id][self.rng.choice(len(order), p=final[by_id])])


def check_finite(logits: np.ndarray) -> None:
    """NonFiniteLogits unless every logit is a finite number (the caller adds where in the sequence)."""
    if not np.isfinite(logits).all():
        raise NonFiniteLogits(NON_FINITE)


def top_k_pairs(row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(ids, float32 values) of the row's k best in best_first's order, or None if a value is not finite: what
    Ops.top_k returns, from a row on the host."""
    row = np.asarray(row, dtype=np.float32).reshape(-1)
    if not np.isfinite(row).all():
        return None
    ids = best_first(row, k)
    return ids, row[ids]


def best_first(x: np.ndarray, m: int) -> np.ndarray:
    """The indices of the `m` largest of `x`, largest first, ties by index: `np.argsort(-x, kind="stable")[:m]`
    without a stable sort of all of `x` (~20 ms a token on a 152k vocabulary)."""
    if m <= 0:
        return np.zeros(0, dtype=np.int64)
    if m >= len(x):
        return _by_value_then_id(x, np.arange(len(x)))
    bound = np.partition(x, len(x) - m)[len(x) - m]  # the m-th largest value
    above = np.flatnonzero(x > bound)
    chosen = np.concatenate([above, np.flatnonzero(x == bound)[: m - len(above)]])
    return _by_value_then_id(x, chosen)


def _by_value_then_id(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """`ids` ordered by x[ids] descending, equal values by id: one sort of 64-bit keys (the value's float32
    bits made monotonic, then the id) instead of a stable argsort, when the values are float32 ones."""
    v = x[ids]
    v32 = v.astype(np.float32)
    if len(x) >= 1 << 32 or not np.array_equal(v32, v):
        return ids[np.argsort(-v, kind="stable")]
    bits = (v32 + np.float32(0.0)).view(np.uint32)  # + 0 makes -0.0 the +0.0 it equals
    monotonic = np.where(bits >> 31, ~bits, bits | np.uint32(1 << 31))  # larger value, larger key
    keys = ((~monotonic).astype(np.uint64) << np.uint64(32)) | ids.astype(np.uint64)
    return (np.sort(keys) & np.uint64(0xFFFFFFFF)).astype(np.int64)


def _candidates(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """A prefix of the chain's order (best first, ties by index) long enough for top-k, top-p and min-p, and
    each one's probability over the top-k set. Without top-k the whole vocabulary normalizes, but only as
    much of the order is built as the top-p and min-p cuts reach (they keep prefixes of it): its length is
    counted from min-p's bound or read off the sorted probabilities, and checked on the prefix."""
    n = len(logits)
    if 0 < p.top_k < n:
        order = best_first(logits, p.top_k)
        return order, _softmax(logits[order].astype(np.float64))
    if p.top_p >= 1.0 and p.min_p <= 0.0:  # nothing cut: every token, in any order (the cuts read no probs)
        return np.arange(n), np.ones(n)
    x = logits.astype(np.float64)
    e = np.exp(x - x.max())
    total = e.sum()
    if p.min_p > 0.0:  # min-p's set holds the kept prefix, whatever top-p cuts (8 more: a margin for rounding)
        m = int(np.count_nonzero(e >= p.min_p * e.max())) + 8
    else:  # top-p's cut read off the sorted probabilities (a sort of floats, not a stable sort of indices)
        m = int(np.searchsorted(np.cumsum(np.sort(e)[::-1]) / total, p.top_p)) + 8
    while True:
        m = min(m, n)
        order = best_first(logits, m)
        probs = e[order] / total
        if m == n or (p.top_p < 1.0 and np.cumsum(probs)[-1] >= p.top_p) or (
                p.min_p > 0.0 and probs[-1] < p.min_p * probs[0]):
            return order, probs
        m *= 2


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()
