"""Sampler.choose_from on the top candidates picks exactly what Sampler.__call__ picks on the full logits.

The GPU hands over only the top-k ids and values (sample_cuda.top_candidates); the sampler must draw
the same token with the same random number, so a seeded run is reproducible on either path.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from runner.engine.sampling import Sampler, SamplingParams
from runner.errors import GenerationError

VOCAB = 3000


def candidates(logits: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.argsort(-logits, kind="stable")[:m].astype(np.int32)
    return ids, logits[ids]


def random_logits(rng: np.random.Generator, ties: bool) -> np.ndarray:
    x = rng.standard_normal(VOCAB) * rng.uniform(0.5, 4.0)
    if ties:  # a coarse grid: many exactly equal logits, including at the top
        x = np.round(x * 2) / 2
    return x.astype(np.float32)


@pytest.mark.parametrize("temperature,top_p,min_p", list(itertools.product(
    [0.05, 0.7, 1.0, 1.8], [0.5, 0.9, 1.0], [0.0, 0.05, 0.3])))
def test_choose_from_equals_full_call_over_seeds(temperature: float, top_p: float, min_p: float) -> None:
    rng = np.random.default_rng(int(temperature * 100 + top_p * 10 + min_p * 1000))
    for seed in range(12):
        top_k = int(rng.choice([1, 2, 5, 40, 100, 1024]))
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
        full, short = Sampler(params), Sampler(params)
        for step in range(8):  # a sequence: the RNG draws must stay in step too
            logits = random_logits(rng, ties=step % 2 == 0)
            ids, values = candidates(logits, top_k + int(rng.integers(0, 30)))
            assert short.choose_from(ids, values, VOCAB) == full(logits), (seed, step, top_k)
        assert short.rng.random() == full.rng.random()


def test_ties_at_the_cut_keep_the_lower_ids() -> None:
    logits = np.zeros(VOCAB, dtype=np.float32)
    logits[[7, 900, 2999]] = 5.0  # every other token ties at 0
    params = SamplingParams(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0, seed=1)
    full, short = Sampler(params), Sampler(params)
    ids, values = candidates(logits, 10)
    assert ids.tolist() == [7, 900, 2999, 0, 1, 2, 3, 4, 5, 6]
    for _ in range(200):
        assert short.choose_from(ids, values, VOCAB) == full(logits)


def test_greedy_takes_the_first_candidate() -> None:
    logits = np.array([1.0, 3.0, 3.0, 2.0], dtype=np.float32)
    ids, values = candidates(logits, 3)
    assert Sampler(SamplingParams(temperature=0.0)).choose_from(ids, values, 4) == 1 == int(np.argmax(logits))


def test_too_few_candidates_are_refused() -> None:
    logits = np.arange(100, dtype=np.float32)
    ids, values = candidates(logits, 10)
    with pytest.raises(GenerationError):
        Sampler(SamplingParams(top_k=40)).choose_from(ids, values, 100)
    with pytest.raises(GenerationError):
        Sampler(SamplingParams(top_k=0)).choose_from(ids, values, 100)
    with pytest.raises(GenerationError):
        Sampler(SamplingParams(top_k=5)).choose_from(ids, values, 50)  # id 99 is outside the vocabulary
