"""The speculative acceptance rule leaves the output distribution unchanged (chi-square tests).

Target and draft distributions are the Sampler's own final distributions (top-k, top-p, min-p and
temperature applied), as in the engine. A rule that only looks right (accepting every draft,
or resampling from p instead of the residual) must fail the same test: the test has power.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable

import numpy as np
import pytest

from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import Sampler, SamplingParams
from runner.spec.config import DraftConfig
from runner.spec.drafter import MTPDrafter
from runner.spec.verify import accept_drafts

VOCAB = 4
N_OUT = 3  # the first three emitted tokens: 64 cells
TRIALS = 20000
CONFIDENCE_Z = 3.09  # one-sided 0.999: a correct rule fails about once in a thousand seeds


def chi2_critical(df: int, z: float = CONFIDENCE_Z) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (within 1% for df >= 10)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2_statistic(counts: dict[tuple[int, ...], int], expected: dict[tuple[int, ...], float], n: int) -> tuple[float, int]:
    """Pearson's statistic over the cells of nonzero probability; a hit on a zero-probability cell is infinite."""
    if any(counts.get(cell, 0) and expected.get(cell, 0.0) == 0.0 for cell in counts):
        return math.inf, 1
    cells = [c for c, p in expected.items() if p > 0]
    stat = sum((counts.get(c, 0) - n * expected[c]) ** 2 / (n * expected[c]) for c in cells)
    return stat, len(cells) - 1


# -- a tiny Markov "model" and drafter over VOCAB tokens -----------------------------------------
PARAMS = SamplingParams(temperature=1.3, top_k=3, top_p=0.97, min_p=0.02, seed=0)
_rng = np.random.default_rng(2024)
MAIN_LOGITS = _rng.normal(0.0, 1.5, (VOCAB, VOCAB))  # logits of the next token given the previous one
DRAFT_LOGITS = MAIN_LOGITS + _rng.normal(0.0, 1.0, (VOCAB, VOCAB))  # a drafter that is close, not equal


P_MAIN = [Sampler(PARAMS).probabilities(row) for row in MAIN_LOGITS]
Q_DRAFT = [Sampler(PARAMS).probabilities(row) for row in DRAFT_LOGITS]


def exact_distribution(start: int) -> dict[tuple[int, ...], float]:
    out = {}
    for seq in itertools.product(range(VOCAB), repeat=N_OUT):
        prob, prev = 1.0, start
        for t in seq:
            prob *= P_MAIN[prev][t]
            prev = t
        out[seq] = prob
    return out


Rule = Callable[[list[int], list[np.ndarray], Callable[[int], np.ndarray], np.random.Generator], tuple[int, int]]


def speculative_samples(rule: Rule, depth: int, start: int, trials: int, seed: int) -> dict[tuple[int, ...], int]:
    """Run verify steps (draft `depth` from q, accept by `rule`) until N_OUT tokens are out; count the outputs."""
    rng = np.random.default_rng(seed)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(trials):
        out, x = [], start
        while len(out) < N_OUT:
            drafts, qs, prev = [], [], x
            for _ in range(depth):
                q = Q_DRAFT[prev]
                prev = int(rng.choice(VOCAB, p=q))
                drafts.append(prev)
                qs.append(q)
            context = [x, *drafts]  # row i of the verify batch follows context[i]
            n, nxt = rule(drafts, qs, lambda i: P_MAIN[context[i]], rng)
            out += drafts[:n] + [nxt]
            x = nxt
        key = tuple(out[:N_OUT])
        counts[key] = counts.get(key, 0) + 1
    return counts


def _accept_everything(drafts, qs, p_row, rng):  # wrong on purpose
    return len(drafts), int(rng.choice(VOCAB, p=p_row(len(drafts))))


def _resample_from_p(drafts, qs, p_row, rng):  # wrong on purpose: ignores the residual
    for i, (t, q) in enumerate(zip(drafts, qs)):
        p = p_row(i)
        if rng.random() * q[t] >= p[t]:
            return i, int(rng.choice(VOCAB, p=p))
    return len(drafts), int(rng.choice(VOCAB, p=p_row(len(drafts))))


# -- tests --------------------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_accepted_and_resampled_tokens_follow_the_target_distribution(depth: int) -> None:
    counts = speculative_samples(accept_drafts, depth, start=1, trials=TRIALS, seed=100 + depth)
    stat, df = chi2_statistic(counts, exact_distribution(1), TRIALS)
    assert stat < chi2_critical(df), f"chi2 {stat:.1f} over {df} degrees of freedom"


@pytest.mark.parametrize("wrong_rule", [_accept_everything, _resample_from_p])
def test_the_chi_square_test_rejects_a_wrong_rule(wrong_rule: Rule) -> None:
    counts = speculative_samples(wrong_rule, 2, start=1, trials=TRIALS, seed=7)
    stat, df = chi2_statistic(counts, exact_distribution(1), TRIALS)
    assert stat > 3 * chi2_critical(df)


def test_greedy_one_hot_rows_accept_while_the_draft_is_the_argmax() -> None:
    rng = np.random.default_rng(0)
    hot = lambda t: np.eye(VOCAB)[t]
    targets = [2, 0, 3, 1]
    assert accept_drafts([2, 0, 1], [hot(2), hot(0), hot(1)], lambda i: hot(targets[i]), rng) == (2, 3)
    assert accept_drafts([2, 0, 3], [hot(2), hot(0), hot(3)], lambda i: hot(targets[i]), rng) == (3, 1)
    assert accept_drafts([1], [hot(1)], lambda i: hot(targets[i]), rng) == (0, 2)


# -- through the engine: drafting with a close drafter on a real (tiny) model ---------------------
ENGINE_PARAMS = SamplingParams(temperature=5.0, top_k=3, top_p=1.0, min_p=0.0)
PROMPT = [12, 250, 71, 399, 8]


class CloseDrafter(MTPDrafter):
    """TEST-ONLY: drafts from a blend of the main model's true distribution (precomputed) and uniform
    mass over its support and a few other tokens.

    Random weights give near-zero acceptance with the real NextN block; with this drafter some drafts
    are always accepted (q <= p), some sometimes (q > p) and some never (p = 0), so every branch of
    the rule runs through the engine's verify step. `rng` is reseeded by the test for each trial.
    """

    def __init__(self, block, n_ctx, ubatch, truth: dict[tuple[int, ...], np.ndarray], noise: list[int]):
        super().__init__(block, n_ctx, ubatch)
        self.truth, self.noise = truth, noise
        self.rng = np.random.default_rng(0)

    def draft(self, token, depth, pick):
        real, _, caught_up = super().draft(token, depth, pick)  # keeps the NextN cache flow exercised
        generated = tuple(self.tokens[len(PROMPT):]) + (token,)
        drafts, qs = [], []
        for _ in real:
            p = self.truth.get(generated + tuple(drafts))
            q = np.zeros(self.block.cfg.n_vocab)
            if p is not None:  # after a draft outside the support any q will do
                q += 0.4 * p
                q[np.flatnonzero(p)] += 0.3 / np.count_nonzero(p)
            q[self.noise] += (1.0 - q.sum()) / len(self.noise)
            drafts.append(int(self.rng.choice(len(q), p=q)))
            qs.append(q)
        return drafts, qs, caught_up


def test_engine_sampling_with_drafts_has_the_plain_distribution(synth_model) -> None:
    path = synth_model("glm4moe", "F32", seed=43, layers=2)  # one dense and one MoE layer: quick
    engine = Engine.load(path, EngineConfig(n_ctx=64))
    sampler = Sampler(ENGINE_PARAMS)
    truth: dict[tuple[int, ...], np.ndarray] = {}

    def fill(prefix: tuple[int, ...]) -> None:  # the plain model's distribution after every reachable prefix
        truth[prefix] = sampler.probabilities(engine.logits_all(PROMPT + list(prefix))[-1])
        if len(prefix) < N_OUT:
            for t in np.flatnonzero(truth[prefix]):
                fill(prefix + (int(t),))

    fill(())
    expected = {}
    for seq in (k for k in truth if len(k) == N_OUT):
        expected[seq] = math.prod(truth[seq[:i]][seq[i]] for i in range(N_OUT))
    assert len(expected) == 27 and abs(sum(expected.values()) - 1.0) < 1e-9
    assert min(expected.values()) * 1000 > 5  # the chi-square approximation needs populated cells
    noise = [3, 4, 5]
    engine.reset()
    engine.drafter = CloseDrafter(engine.nextn[0], engine.n_ctx, engine.config.ubatch, truth, noise)
    trials, counts = 1000, {}
    for seed in range(trials):
        params = SamplingParams(**{**ENGINE_PARAMS.__dict__, "seed": seed})
        engine.drafter.rng = np.random.default_rng(10**6 + seed)
        # One token past the three counted, so the first verify step drafts at depth 2.
        gen = engine.generate(PROMPT, N_OUT + 1, params, ignore_eos=True,
                              draft=DraftConfig("mtp", 2, adaptive=False)).run()
        counts[tuple(gen.tokens[:N_OUT])] = counts.get(tuple(gen.tokens[:N_OUT]), 0) + 1
    stats = engine.draft_stats()
    assert stats["drafted_by_depth"][1] > trials / 2, stats
    assert 0.2 < stats["draft_acceptance"] < 0.8, stats  # both branches ran many times
    stat, df = chi2_statistic(counts, expected, trials)
    assert stat < chi2_critical(df), f"chi2 {stat:.1f} over {df} degrees of freedom"
