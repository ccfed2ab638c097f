"""Decode's fused launches (issue 20: fewer launches a token) against the launches they replace, bit for bit:
gemv_multi_normed is rms_norm then gemv_multi; gemv_norm_route is rms_norm, gemv and route (its last block ranks,
on a counter it resets, also inside a replayed CUDA graph); expert_down_combine is expert_gemv then combine (each
column tile's last block sums, across a directory graph's two passes too); and decoding with CudaOps'
FUSED_NORMS and FUSED_COMBINE gives the tokens decoding without them gives, resident, offloaded and with MTP
verify batches."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda import gemv as gemv_cuda  # noqa: E402
from runner.backends.cuda import norm_rope as norm_rope_cuda  # noqa: E402
from runner.backends.cuda import route as route_cuda  # noqa: E402
from test_gemv_cuda import assert_bitwise_equal, weights  # noqa: E402
from test_gemv_multi_cuda import CASES  # noqa: E402

EPS = 1e-6


def _norm(rng: np.random.Generator, k: int) -> cp.ndarray:
    return cp.asarray((1 + 0.1 * rng.standard_normal(k)).astype(np.float32))


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_multi_normed_has_the_bits_of_the_norm_then_the_products(name: str, rows: int) -> None:
    qtypes, ns, k = CASES[name]
    rng = np.random.default_rng(21)
    mats = [(cp.asarray(weights(rng, q, (n, k))[0]), q) for q, n in zip(qtypes, ns)]
    biases = [cp.asarray(rng.standard_normal(n).astype(np.float32)) if i != 1 else None for i, n in enumerate(ns)]
    x = cp.asarray((3 * rng.standard_normal((rows, k))).astype(np.float32))
    norm_w = _norm(rng, k)
    want = gemv_cuda.gemv_multi(norm_rope_cuda.rms_norm(x, norm_w, EPS), mats, biases)
    got = gemv_cuda.gemv_multi_normed(x, norm_w, EPS, mats, biases)
    for i, (y, w) in enumerate(zip(got, want)):
        assert_bitwise_equal(y, w, f"{name} matrix {i}, {rows} rows")


# (experts, used, gating, bias, groups, groups used, weights norm, scale, row length, router type): seed's router
# (512 experts, top 10, sigmoid with a bias, 2.5), a softmax one (qwen3moe), grouped selection, a quantized router.
ROUTERS = {
    "seed": (512, 10, "sigmoid", True, 1, 1, True, 2.5, 2048, QT.F32),
    "softmax": (128, 8, "softmax", False, 1, 1, True, 0.0, 256, QT.F32),
    "groups": (256, 8, "sigmoid", True, 8, 4, True, 1.0, 512, QT.F32),
    "q8": (64, 4, "softmax", False, 1, 1, False, 0.0, 512, QT.Q8_0),
}


def _router(name: str, rng: np.random.Generator):
    n, used, gating, with_bias, groups, groups_used, norm, scale, k, qtype = ROUTERS[name]
    w = cp.asarray(weights(rng, qtype, (n, k))[0])
    bias = cp.asarray((0.1 * rng.standard_normal(n)).astype(np.float32)) if with_bias else None
    return k, w, qtype, (bias, gating, used, groups, groups_used, norm, scale)


def _unfused(x, norm_w, k, w, qtype, selection):
    h = norm_rope_cuda.rms_norm(x, norm_w, EPS)
    return (h, *route_cuda.route(gemv_cuda.gemv(h, w, qtype, k), *selection))


def _assert_same(got, want, what: str) -> None:
    for name, a, b in zip(("h", "ids", "weights"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {name} {a.dtype} {a.shape} != {b.dtype} {b.shape}"
        assert cp.array_equal(a.view(cp.uint32) if a.dtype == cp.float32 else a,
                              b.view(cp.uint32) if b.dtype == cp.float32 else b), f"{what}: {name} differs"


@pytest.mark.parametrize("name", list(ROUTERS))
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_norm_route_has_the_bits_of_its_three_launches(name: str, rows: int) -> None:
    rng = np.random.default_rng(22)
    k, w, qtype, selection = _router(name, rng)
    norm_w = _norm(rng, k)
    assert gemv_cuda.norm_route_fits(rows, k, w.shape[0], qtype)
    for attempt in range(3):  # each launch leaves the counter as it found it
        x = cp.asarray((2 * rng.standard_normal((rows, k))).astype(np.float32))
        got = gemv_cuda.gemv_norm_route(x, norm_w, EPS, w, qtype, *selection)
        _assert_same(got, _unfused(x, norm_w, k, w, qtype, selection), f"{name}, {rows} rows, launch {attempt}")


@pytest.mark.parametrize("warp_columns,ahead,tile_warps", [(1, 1, None), (1, 8, None), (2, 4, None), (1, 3, None),
                                                        (1, 8, 4), (2, 1, 1), (1, 8, 8)])
@pytest.mark.parametrize("name", ["seed", "groups"])
def test_norm_route_keeps_its_bits_at_every_route_shape(monkeypatch: pytest.MonkeyPatch, name: str,
                                                        warp_columns: int, ahead: int, tile_warps: int | None) -> None:
    """ROUTE_WARP_COLUMNS, ROUTE_LOAD_AHEAD and ROUTE_TILE_WARPS (a float router's CTAs, the units a lane has in
    flight, 3 leaving a partial last round of the ring, and the warps of a CTA that compute columns) change when
    bytes arrive and which CTA sums a column, not which sums run: the unfused launches' bits."""
    monkeypatch.setattr(gemv_cuda, "ROUTE_WARP_COLUMNS", warp_columns)
    monkeypatch.setattr(gemv_cuda, "ROUTE_LOAD_AHEAD", ahead)
    monkeypatch.setattr(gemv_cuda, "ROUTE_TILE_WARPS", tile_warps)
    rng = np.random.default_rng(24)
    k, w, qtype, selection = _router(name, rng)
    norm_w = _norm(rng, k)
    for rows in (1, 4):
        x = cp.asarray((2 * rng.standard_normal((rows, k))).astype(np.float32))
        got = gemv_cuda.gemv_norm_route(x, norm_w, EPS, w, qtype, *selection)
        _assert_same(got, _unfused(x, norm_w, k, w, qtype, selection), f"{name}, {rows} rows")


def test_a_router_beside_another_on_its_own_stream_keeps_both_rankings() -> None:
    """beside=True (a prefetch's guess) takes its own last-block counter, so it may run on another stream while a
    layer's router runs: both rank as they would alone, launch after launch."""
    rng = np.random.default_rng(25)
    k, w, qtype, selection = _router("seed", rng)
    norm_w = _norm(rng, k)
    guess_selection = (selection[0], selection[1], 5, *selection[3:])  # a guess is its own depth
    main, side = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    for attempt in range(20):
        x = cp.asarray((2 * rng.standard_normal((1, k))).astype(np.float32))
        cp.cuda.Device().synchronize()
        with main:
            own = gemv_cuda.gemv_norm_route(x, norm_w, EPS, w, qtype, *selection)
        with side:
            guess = gemv_cuda.gemv_norm_route(x, norm_w, EPS, w, qtype, *guess_selection, beside=True)
        cp.cuda.Device().synchronize()
        _assert_same(own, _unfused(x, norm_w, k, w, qtype, selection), f"the router, launch {attempt}")
        _assert_same(guess, _unfused(x, norm_w, k, w, qtype, guess_selection), f"the guess, launch {attempt}")


def test_norm_route_replays_in_a_graph_as_it_runs_eagerly() -> None:
    rng = np.random.default_rng(23)
    k, w, qtype, selection = _router("seed", rng)
    norm_w = _norm(rng, k)
    x = cp.asarray(rng.standard_normal((1, k)).astype(np.float32))
    gemv_cuda.gemv_norm_route(x, norm_w, EPS, w, qtype, *selection)  # compiled and counters made before capture
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        outs = [gemv_cuda.gemv_norm_route(x, norm_w, EPS, w, qtype, *selection) for _ in range(3)]  # three layers
        graph = stream.end_capture()
    for _ in range(4):
        x[...] = cp.asarray(rng.standard_normal((1, k)).astype(np.float32))
        graph.launch(stream)
        stream.synchronize()
        want = _unfused(x, norm_w, k, w, qtype, selection)
        for i, got in enumerate(outs):
            _assert_same(got, want, f"replayed layer {i}")


DOWN_CASES = {"seed-q4": (QT.Q4_K, 2048, 512), "seed-q6": (QT.Q6_K, 2048, 512), "odd": (QT.Q8_0, 100, 256)}


def _down(name: str, n_tok: int, k: int, shared: bool, seed: int):
    qtype, n, row = DOWN_CASES[name]
    rng = np.random.default_rng(seed)
    pairs = n_tok * (k + 1 if shared else k)
    w = cp.asarray(weights(rng, qtype, (pairs * n, row))[0])  # a matrix per pair, as the expert tables point
    ptrs = cp.asarray(np.uint64(w.data.ptr) + np.arange(pairs, dtype=np.uint64) * np.uint64(n * w.shape[1]))
    h = cp.asarray(rng.standard_normal((pairs, row)).astype(np.float32))
    rows = cp.arange(pairs, dtype=cp.int32)
    mix = cp.asarray(rng.random((n_tok, k)).astype(np.float32))
    residual = cp.asarray(rng.standard_normal((n_tok, n)).astype(np.float32))
    return qtype, n, row, h, rows, ptrs, mix, residual


@pytest.mark.parametrize("name", list(DOWN_CASES))
@pytest.mark.parametrize("n_tok,k,shared", [(1, 10, True), (1, 8, False), (4, 10, True), (3, 2, False)])
def test_down_combine_has_the_bits_of_the_down_products_then_combine(name: str, n_tok: int, k: int,
                                                                      shared: bool) -> None:
    qtype, n, row, h, rows, ptrs, mix, residual = _down(name, n_tok, k, shared, 24)
    for res in (None, residual):
        y = cp.empty((rows.size, n), dtype=cp.float32)
        want = route_cuda.combine(gemv_cuda.expert_gemv(h, rows, ptrs, qtype, n, row), mix, residual=res, shared=shared)
        for attempt in range(2):  # the counters are left at zero
            got = gemv_cuda.expert_down_combine(h, rows, ptrs, qtype, n, row, y, mix, res, shared)
            assert_bitwise_equal(got, want, f"{name}, {n_tok} x {k}, shared {shared}, residual {res is not None}")


@pytest.mark.parametrize("held", ["some", "all", "none"])
def test_down_combine_sums_once_over_two_passes(held: str) -> None:
    """A directory graph's passes: the held pairs' launch, then the filled pairs'; the sum is written once all of a
    tile's pairs are in, by whichever launch completes them."""
    qtype, n, row, h, rows, ptrs, mix, residual = _down("seed-q4", 2, 10, True, 25)
    rng = np.random.default_rng(26)
    flags = {"some": rng.random(rows.size) < 0.4, "all": np.zeros(rows.size, bool), "none": np.ones(rows.size, bool)}
    pass_of = cp.asarray(flags[held].astype(np.int32))  # 1: filled this step, its pass after the fills
    want = route_cuda.combine(gemv_cuda.expert_gemv(h, rows, ptrs, qtype, n, row), mix, residual=residual, shared=True)
    y = cp.empty((rows.size, n), dtype=cp.float32)
    out = cp.full((2, n), cp.nan, dtype=cp.float32)
    for phase in (0, 1):
        gemv_cuda.expert_down_combine(h, rows, ptrs, qtype, n, row, y, mix, residual, True, (pass_of, phase), out)
    assert_bitwise_equal(out, want, f"two passes, {held} held")


def test_down_combine_replays_in_a_graph() -> None:
    qtype, n, row, h, rows, ptrs, mix, residual = _down("seed-q6", 1, 10, True, 27)
    y = cp.empty((rows.size, n), dtype=cp.float32)
    gemv_cuda.expert_down_combine(h, rows, ptrs, qtype, n, row, y, mix, residual, True)  # compiled before capture
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        outs = [gemv_cuda.expert_down_combine(h, rows, ptrs, qtype, n, row, y, mix, residual, True) for _ in range(3)]
        graph = stream.end_capture()
    rng = np.random.default_rng(28)
    for _ in range(3):
        h[...] = cp.asarray(rng.standard_normal(h.shape).astype(np.float32))
        graph.launch(stream)
        stream.synchronize()
        want = route_cuda.combine(gemv_cuda.expert_gemv(h, rows, ptrs, qtype, n, row), mix, residual=residual,
                                  shared=True)
        for i, got in enumerate(outs):
            assert_bitwise_equal(got, want, f"replayed layer {i}")


def test_fits_refuses_what_the_kernels_cannot_take() -> None:
    assert not gemv_cuda.normed_fits(gemv_cuda.NORMED_MAX_ROWS + 1, 2048)
    assert not gemv_cuda.normed_fits(1, 1 << 20)  # 4 MB of normed rows: past any block's shared memory
    assert not gemv_cuda.norm_route_fits(1, 2048, 513, QT.F32)  # more experts than the ranking's threads


@pytest.fixture(scope="module")
def model_path(synth_model):
    return synth_model("glm4moe", "Q4_K_M", seed=75, direct=True)


@pytest.mark.parametrize("offload,depth", [(False, 0), (True, 0), (False, 3), (True, 3)])
def test_decoding_with_fused_launches_gives_the_same_tokens(model_path, offload: bool, depth: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy decoding (graphs, resident and under offload's directory graphs; MTP verify batches of 4 rows) with
    FUSED_NORMS and FUSED_COMBINE takes the fused launches and gives the tokens decoding without them gives."""
    from runner.backends.cuda import ops as cuda_ops
    from runner.engine.engine import Engine, EngineConfig
    from runner.engine.sampling import SamplingParams
    from runner.offload.offload import OffloadConfig
    from runner.spec.config import DraftConfig

    prompt = [7, 93, 411, 250, 18, 333, 64, 120, 5, 499, 77, 201]
    calls = {"multi": 0, "route": 0, "combine": 0}
    for name, key in (("gemv_multi_normed", "multi"), ("gemv_norm_route", "route"), ("expert_down_combine", "combine")):
        real = getattr(gemv_cuda, name)
        monkeypatch.setattr(gemv_cuda, name, lambda *a, _real=real, _key=key, **kw: calls.__setitem__(_key, calls[_key] + 1) or _real(*a, **kw))

    def run(fused: bool) -> list[int]:
        monkeypatch.setattr(cuda_ops, "FUSED_NORMS", fused)
        monkeypatch.setattr(cuda_ops, "FUSED_COMBINE", fused)
        config = EngineConfig(n_ctx=512, ubatch=64,
                              offload=OffloadConfig(cache_slots=8, decode_batch=4, transaction="always")
                              if offload else None)
        engine = Engine.load(model_path, config, ops=cuda_ops.CudaOps())
        draft = DraftConfig("mtp", depth, adaptive=False) if depth else None
        return engine.generate(prompt, 96, SamplingParams(temperature=0.0), ignore_eos=True, draft=draft).run().tokens

    plain = run(False)
    assert calls == {"multi": 0, "route": 0, "combine": 0}
    assert run(True) == plain
    assert all(calls.values()), calls
