"""The sampler's candidate filters follow llama.cpp's order: top-k, top-p, min-p, then temperature."""

from __future__ import annotations

import numpy as np
import pytest

from runner.engine.sampling import Sampler, SamplingParams
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
