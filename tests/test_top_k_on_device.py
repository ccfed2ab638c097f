"""Engine.TOP_K_ON_DEVICE: sampled requests whose chain starts with top-k take each decoded token's k best
(id, logit) pairs from the backend (Ops.top_k) and draw on the host from them (Sampler.from_top_k). The same
tokens as drawing from the whole row, seed for seed, resident and under expert offload; every request that needs
the row (greedy, penalties, a bias, logprobs, top_k 0) still takes it; and cuda/top_k.cu's algorithm, transliterated
(64-bit keys, tiles' best, a merge), orders exactly as sampling.best_first does."""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import Sampler, SamplingParams, best_first, top_k_pairs
from runner.offload.offload import OffloadConfig

PROMPT = [5, 6, 8, 13, 21]


class CountingOps(NumpyOps):
    def __init__(self) -> None:
        super().__init__()
        self.top_k_calls = 0

    def top_k(self, logits, k):
        self.top_k_calls += 1
        return super().top_k(logits, k)


@pytest.fixture(scope="module", params=["resident", "offload"])
def engine(request, synth_model) -> Engine:
    offload = OffloadConfig(cache_slots=3, prefill_ubatch=8, transaction="always") if request.param == "offload" else None
    return Engine.load(synth_model("glm4moe"), EngineConfig(n_ctx=96, ubatch=8, offload=offload), ops=CountingOps())


def _run(engine: Engine, on: bool, monkeypatch, sampling: SamplingParams, **kwargs) -> tuple[tuple, int]:
    monkeypatch.setattr(Engine, "TOP_K_ON_DEVICE", on)
    engine.reset()
    before = engine.ops.top_k_calls
    gen = engine.generate(PROMPT, kwargs.pop("n", 24), sampling, **kwargs).run()
    return (gen.tokens, gen.text, gen.finish_reason), engine.ops.top_k_calls - before


@pytest.mark.parametrize("sampling", [
    SamplingParams(seed=7), SamplingParams(seed=8, top_k=5), SamplingParams(seed=9, top_p=1.0, min_p=0.0),
    SamplingParams(seed=10, min_p=0.2, temperature=1.5), SamplingParams(seed=11, top_k=64, top_p=0.5),
], ids=lambda p: f"k{p.top_k}-p{p.top_p}-m{p.min_p}-t{p.temperature}")
def test_the_backends_top_k_draws_the_hosts_tokens(engine: Engine, monkeypatch, sampling: SamplingParams) -> None:
    on_host, calls_off = _run(engine, False, monkeypatch, sampling, ignore_eos=True)
    on_device, calls_on = _run(engine, True, monkeypatch, sampling, ignore_eos=True)
    assert on_device == on_host and len(set(on_host[0])) > 3  # drawn, not one token over and over
    assert calls_off == 0 and calls_on == len(on_host[0]) - 1  # every decoded token's, none for the prompt's


@pytest.mark.parametrize("sampling,kwargs", [
    (SamplingParams(temperature=0.0), {}),
    (SamplingParams(seed=3, top_k=0), {}),
    (SamplingParams(seed=3, frequency_penalty=1.0), {}),
    (SamplingParams(seed=3, repeat_penalty=1.3), {}),
    (SamplingParams(seed=3, logit_bias=((7, 5.0),)), {}),
    (SamplingParams(seed=3), {"logprobs": 2}),
])
def test_requests_that_need_the_row_still_take_it(engine: Engine, monkeypatch, sampling, kwargs: dict) -> None:
    on_host, _ = _run(engine, False, monkeypatch, sampling, ignore_eos=True, n=8, **dict(kwargs))
    flagged, calls = _run(engine, True, monkeypatch, sampling, ignore_eos=True, n=8, **dict(kwargs))
    assert calls == 0 and flagged == on_host


def _rows(rng: np.random.Generator) -> list[np.ndarray]:
    """Rows with ties, signed zeros, a few distinct values, and lengths off the tile size."""
    rows = [rng.standard_normal(151552).astype(np.float32) * 4,
            rng.integers(-3, 4, 5000).astype(np.float32),  # a handful of values: ties everywhere
            np.zeros(4097, np.float32), rng.standard_normal(65).astype(np.float32)]
    signed = -np.abs(rng.standard_normal(3000)).astype(np.float32)  # the best are zeros of both signs: equal
    signed[::7] = -0.0
    signed[3::7] = 0.0
    rows.append(signed)
    return rows


@pytest.mark.parametrize("k", [1, 2, 40, 64])
def test_the_sampler_draws_from_the_top_k_what_it_draws_from_the_row(k: int) -> None:
    rng = np.random.default_rng(k)
    for row in _rows(rng):
        if k >= len(row):
            continue
        for params in (SamplingParams(seed=1, top_k=k), SamplingParams(seed=2, top_k=k, top_p=1.0, min_p=0.0),
                       SamplingParams(seed=3, top_k=k, temperature=0.3, min_p=0.5)):
            whole, top = Sampler(params), Sampler(params)
            pairs = top_k_pairs(row, k)
            assert pairs is not None
            assert [whole(row) for _ in range(20)] == [top.from_top_k(*pairs) for _ in range(20)]
    bad = np.ones(100, np.float32)
    bad[50] = np.nan
    assert top_k_pairs(bad, 4) is None and NumpyOps().top_k(bad, 4) is None


TILE, CANDIDATES = 2048, 8192  # cuda/top_k.cu's TOPK_TILE and TOPK_CANDIDATES


def _rank_keys(row: np.ndarray) -> np.ndarray:
    """top_k.cu's rank_key: the value's monotonic float32 bits (after + 0) over the complement of its index."""
    bits = (row + np.float32(0.0)).view(np.uint32)
    mono = np.where(bits >> 31, ~bits, bits | np.uint32(1 << 31)).astype(np.uint64)
    return (mono << np.uint64(32)) | (np.uint64(0xFFFFFFFF) - np.arange(len(row), dtype=np.uint64))


def _kernel_top_k(row: np.ndarray, k: int) -> np.ndarray:
    """top_k_tiles then top_k_merge, in numpy: each tile's k best keys (zeros past the row), then the k best."""
    keys = _rank_keys(row)
    tiles = -(-len(row) // TILE)
    assert tiles * k <= CANDIDATES
    padded = np.zeros(tiles * TILE, np.uint64)
    padded[: len(row)] = keys
    cand = np.sort(padded.reshape(tiles, TILE), axis=1)[:, ::-1][:, :k].reshape(-1)
    merged = np.sort(cand)[::-1][:k]
    return (np.uint64(0xFFFFFFFF) - (merged & np.uint64(0xFFFFFFFF))).astype(np.int64)


@pytest.mark.parametrize("k", [1, 3, 40, 64])
def test_the_kernels_keys_order_as_best_first(k: int) -> None:
    rng = np.random.default_rng(100 + k)
    for row in _rows(rng):
        if k < len(row) and -(-len(row) // TILE) * k <= CANDIDATES:
            assert np.array_equal(_kernel_top_k(row, k), best_first(row, k)), (len(row), k)
