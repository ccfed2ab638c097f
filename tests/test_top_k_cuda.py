"""cuda/top_k.cu against sampling.top_k_pairs (best_first's order: ties to the lower id, -0.0 equal to 0.0), the
non-finite rows it refuses, and Engine.TOP_K_ON_DEVICE on CudaOps drawing the tokens the row gives, seed for seed,
resident and under offload's directory graphs."""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda import ops as cuda_ops  # noqa: E402
from runner.backends.cuda import top_k as top_k_cuda  # noqa: E402
from runner.engine.engine import Engine, EngineConfig  # noqa: E402
from runner.engine.sampling import SamplingParams, top_k_pairs  # noqa: E402
from runner.offload.offload import OffloadConfig  # noqa: E402
from test_top_k_on_device import _rows  # noqa: E402


@pytest.mark.parametrize("k", [1, 2, 40, 64])
def test_the_kernel_gives_best_firsts_pairs(k: int) -> None:
    rng = np.random.default_rng(k)
    rows = _rows(rng) + [np.full(262144, 1.5, np.float32), rng.standard_normal(200000).astype(np.float32)]
    for row in rows:
        if not top_k_cuda.fits(len(row), k):
            continue
        ids, values = top_k_cuda.top_k(cp.asarray(row), k)
        want_ids, want_values = top_k_pairs(row, k)
        assert np.array_equal(ids, want_ids), (len(row), k)
        assert np.array_equal(values.view(np.uint32), want_values.view(np.uint32))


def test_the_kernel_refuses_non_finite_rows_and_fits_says_where_it_runs() -> None:
    for bad in (np.nan, np.inf, -np.inf):
        row = np.ones(151552, np.float32)
        row[123456] = bad
        assert top_k_cuda.top_k(cp.asarray(row), 40) is None
    assert top_k_cuda.fits(151552, 64) and top_k_cuda.fits(262144, 64) and not top_k_cuda.fits(262145, 64)
    assert not top_k_cuda.fits(40, 40) and not top_k_cuda.fits(1000, 65) and not top_k_cuda.fits(1000, 0)


@pytest.fixture(scope="module", params=["resident", "directory"])
def engine(request, synth_model) -> Engine:
    offload = (None if request.param == "resident"
               else OffloadConfig(cache_slots=8, decode_graph="directory", transaction="always"))
    path = synth_model("glm4moe", "Q4_K_M", seed=75, direct=True)
    return Engine.load(path, EngineConfig(n_ctx=512, ubatch=64, offload=offload), ops=cuda_ops.CudaOps())


@pytest.mark.parametrize("sampling", [SamplingParams(seed=7), SamplingParams(seed=8, top_k=64, min_p=0.0, top_p=0.9)])
def test_sampling_from_the_devices_top_k_gives_the_rows_tokens(engine: Engine, monkeypatch, sampling) -> None:
    got = {}
    for on in (False, True):
        monkeypatch.setattr(Engine, "TOP_K_ON_DEVICE", on)
        engine.reset()
        got[on] = engine.generate([7, 93, 411, 250, 18], 48, sampling, ignore_eos=True).run().tokens
    assert got[True] == got[False] and len(set(got[False])) > 3
