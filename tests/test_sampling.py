"""The sampler's candidate filters follow llama.cpp's order: top-k, top-p, min-p, then temperature."""

from __future__ import annotations

import numpy as np
import pytest

from runner.engine.sampling import Sampler, SamplingParams, best_first
from runner.engine.stopping import StopMatcher
from runner.errors import GenerationError

LOGITS = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))


def kept(**kw) -> list[int]:
    probs = Sampler(SamplingParams(temperature=1.0, **{"top_k": 0, "top_p": 1.0, "min_p": 0.0, **kw})).probabilities(LOGITS)
    return [i for i, p in enumerate(probs) if p > 0]


def test_filters_keep_the_expected_candidates() -> None:
    assert kept() == [0, 1, 2, 3, 4]
    assert kept(top_k=2) == [0, 1]
    assert kept(top_p=0.7) == [0, 1]  # 0.5 + 0.2 reaches 0.7
    assert kept(top_p=0.71) == [0, 1, 2]
    assert kept(min_p=0.35) == [0, 1]  # 0.15 < 0.35 * 0.5
    assert kept(min_p=0.3) == [0, 1, 2]  # the bound itself is kept, as in llama.cpp


def test_temperature_sharpens_and_probabilities_sum_to_one() -> None:
    cold = Sampler(SamplingParams(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0)).probabilities(LOGITS)
    warm = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)).probabilities(LOGITS)
    assert cold.sum() == pytest.approx(1.0) and warm.sum() == pytest.approx(1.0)
    assert cold[0] > warm[0]
    np.testing.assert_allclose(warm, np.exp(LOGITS), rtol=1e-9)


def test_sampled_frequencies_follow_the_distribution() -> None:
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3))
    counts = np.bincount([sampler(LOGITS) for _ in range(20000)], minlength=5) / 20000
    np.testing.assert_allclose(counts, np.exp(LOGITS), atol=0.015)


def chain_by_full_sort(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The chain as written before the partial sort: the whole vocabulary sorted, then each cut."""
    x = np.asarray(logits, dtype=np.float64)
    order = np.argsort(-x, kind="stable")
    if p.top_k > 0:
        order = order[: p.top_k]
    e = np.exp(x[order] - x[order].max())
    probs = e / e.sum()
    if p.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        order, probs = order[:keep], probs[:keep]
    if p.min_p > 0.0:
        order = order[probs >= p.min_p * probs[0]]
    f = np.exp((x[order] - x[order].max()) / p.temperature)
    out = np.zeros(len(x))
    out[order] = f / f.sum()
    return out


def test_best_first_is_the_stable_sort_prefix_ties_and_masks_included() -> None:
    rng = np.random.default_rng(0)
    for trial in range(200):
        x = rng.integers(-4, 4, int(rng.integers(1, 300))).astype(np.float32)  # many ties
        x[rng.integers(0, len(x), len(x) // 4)] = -0.0  # equal to +0.0: a tie, ordered by index
        if trial % 3 == 0:
            x[rng.integers(0, len(x), len(x) // 3)] = -np.inf  # a grammar's mask
        if trial % 5 == 0:
            x = x.astype(np.float64)  # a grammar's float64 copy of float32 logits
        if trial % 7 == 0:
            x = rng.standard_normal(len(x))  # float64 values no float32 holds: the stable argsort itself
        for m in {1, 2, 7, len(x) - 1, len(x), len(x) + 5} - {0}:
            assert best_first(x, m).tolist() == np.argsort(-x, kind="stable")[:m].tolist()


def test_the_partial_sort_keeps_the_full_sorts_candidates_and_draws() -> None:
    """Top-k, top-p and min-p read only the best prefix of the vocabulary; the kept set, its probabilities and
    the token drawn from a given generator state are those of sorting everything."""
    rng = np.random.default_rng(1)
    for trial in range(150):
        logits = (rng.standard_normal(4000) * rng.uniform(0.5, 6)).astype(np.float32)
        if trial % 4 == 0:
            logits = np.round(logits)  # ties at every cut
        p = SamplingParams(seed=trial, top_k=int(rng.choice([0, 1, 20, 40, 5000])), top_p=float(rng.uniform(0.3, 1)),
                           min_p=float(rng.choice([0.0, 0.01, 0.1])), temperature=float(rng.uniform(0.2, 1.5)))
        want = chain_by_full_sort(logits, p)
        got = Sampler(p).probabilities(logits)
        assert np.flatnonzero(got).tolist() == np.flatnonzero(want).tolist()
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
        whole = Sampler(p)
        assert Sampler(p)(logits) == int(whole.rng.choice(len(logits), p=whole.probabilities(logits)))


def test_greedy_takes_the_argmax() -> None:
    assert Sampler(SamplingParams(temperature=0.0))(np.array([0.1, 3.0, 2.9])) == 1


@pytest.mark.parametrize("kw", [{"top_p": 0.0}, {"min_p": 1.5}, {"temperature": -1.0}])
def test_invalid_settings_are_refused(kw) -> None:
    with pytest.raises(GenerationError):
        SamplingParams(**kw)


def test_stop_matcher_holds_back_partial_matches() -> None:
    m = StopMatcher(["</end>"])
    assert m.push("hello </e") == "hello "
    assert m.push("nd> tail") == ""
    assert m.stopped
    m = StopMatcher(["</end>"])
    assert m.push("a </e") == "a "
    assert m.push("xtra") == "</extra"
    assert m.flush() == ""


def test_tiny_temperature_is_finite_and_bad_numbers_are_refused() -> None:
    sampler = Sampler(SamplingParams(temperature=1e-300, top_k=0, top_p=1.0, min_p=0.0, seed=0))
    assert sampler(LOGITS) == 0
    for kw in ({"temperature": float("nan")}, {"top_p": float("inf")}, {"seed": -1}):
        with pytest.raises(GenerationError):
            SamplingParams(**kw)
