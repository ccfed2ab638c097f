"""greedy and top_candidates (cuda/sample.cu) against np.argmax and np.argsort(-x, kind="stable").

All exact: both only compare and copy logits (ties to the lower id, -0 equal to +0).
"""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available
from runner.engine.sampling import Sampler, SamplingParams

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda import sample as sample_cuda  # noqa: E402


def logits_with_ties(rng: np.random.Generator, n: int) -> np.ndarray:
    """A coarse grid (values repeat, -0.0 and +0.0 both occur) with the maximum planted three times."""
    x = np.round(rng.standard_normal(n) * 3) / 4
    x[rng.integers(0, n, 3)] = x.max() + 1 if n > 3 else x.max()
    return x.astype(np.float32)


@pytest.mark.parametrize("n", [1, 2, 5, 1023, 4096, 4097, 151552, 262144])
def test_greedy_equals_numpy_argmax(n: int) -> None:
    rng = np.random.default_rng(n)
    for x in (rng.standard_normal(n).astype(np.float32), logits_with_ties(rng, n),
              np.full(n, -np.inf, dtype=np.float32), np.zeros(n, dtype=np.float32)):
        assert sample_cuda.greedy(cp.asarray(x)) == int(np.argmax(x))


@pytest.mark.parametrize("n,k", [(1, 1), (7, 7), (1000, 40), (4096, 1024), (4097, 1), (151552, 1),
                                 (151552, 40), (151552, 110), (151552, 111), (151552, 1024), (262144, 1024)])
def test_top_candidates_equal_numpy_argsort(n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    for x in (rng.standard_normal(n).astype(np.float32), logits_with_ties(rng, n), np.zeros(n, dtype=np.float32)):
        ids, values = sample_cuda.top_candidates(cp.asarray(x), k)
        want = np.argsort(-x, kind="stable")[:k]
        assert ids.dtype == np.int32 and values.dtype == np.float32
        np.testing.assert_array_equal(ids, want)
        np.testing.assert_array_equal(values.view(np.int32), x[want].view(np.int32))  # the very bits


def test_sampling_from_gpu_candidates_equals_sampling_from_full_logits() -> None:
    rng = np.random.default_rng(5)
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=11)
    full, short = Sampler(params), Sampler(params)
    for _ in range(20):
        x = logits_with_ties(rng, 151552)
        ids, values = sample_cuda.top_candidates(cp.asarray(x), 40)
        assert short.choose_from(ids, values, len(x)) == full(x)
