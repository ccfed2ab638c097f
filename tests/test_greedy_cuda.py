"""The device's greedy choice (cuda/greedy.cu) against NumpyOps.greedy_token: np.argmax's index (the first of
equals) of rows of any length, and None for a row holding a NaN or an infinity."""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available
from runner.backends.numpy.ops import NumpyOps

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda import greedy as greedy_cuda  # noqa: E402


@pytest.mark.parametrize("n", [1, 7, 1023, 1024, 1025, 4096, 151552, 152064])
def test_the_index_of_the_largest_value_as_numpy_chooses_it(n: int) -> None:
    rng = np.random.default_rng(n)
    row = (rng.standard_normal(n) * 4).astype(np.float32)
    assert greedy_cuda.greedy_token(cp.asarray(row)) == NumpyOps().greedy_token(row) == int(np.argmax(row))
    tied = np.round(row).astype(np.float32)  # many equal maxima: the first one wins
    assert greedy_cuda.greedy_token(cp.asarray(tied[None])) == int(np.argmax(tied))


def test_ties_signed_zeros_and_the_last_position() -> None:
    for row in ([0.0, 0.0, 0.0], [-0.0, 0.0, -1.0], [-1.0, -1.0, 2.0], [-5.0] * 2047 + [-4.0]):
        row = np.array(row, dtype=np.float32)
        assert greedy_cuda.greedy_token(cp.asarray(row)) == int(np.argmax(row))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("at", [0, 1500, 151551])
def test_a_row_with_a_non_finite_value_has_no_choice(bad: float, at: int) -> None:
    row = np.random.default_rng(at).standard_normal(151552).astype(np.float32)
    row[at] = bad
    assert greedy_cuda.greedy_token(cp.asarray(row)) is None is NumpyOps().greedy_token(row)
    assert greedy_cuda.greedy_token(cp.full(9, -np.inf, dtype=cp.float32)) is None


@pytest.mark.parametrize("rows", [1, 2, 4])
def test_a_batchs_rows_each_get_their_own_choice(rows: int) -> None:
    """greedy_rows (a verify batch's): each row's greedy_token, a non-finite row's None among finite ones."""
    logits = (np.random.default_rng(rows).standard_normal((rows, 151552)) * 4).astype(np.float32)
    if rows > 1:
        logits[1, 77] = np.nan
    want = NumpyOps().greedy_rows(logits)
    assert greedy_cuda.greedy_rows(cp.asarray(logits)) == want
    assert want == [None if r == 1 and rows > 1 else int(np.argmax(logits[r])) for r in range(rows)]
