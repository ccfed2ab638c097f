"""runner.backends.cuda.gemv against its numpy twin (x @ gguf.quants.dequantize(w).T in float64), and its batch invariance.

Tolerance |y - ref| <= 1e-5 * (|x| @ |W|^T) + 1e-30: float32 products summed in the kernel's own
order (the module docstring of runner/backends/cuda/gemv.py derives it). Batch invariance is asserted bit for
bit: a row's result is the same alone, with 1..7 other rows, through expert_gemv, and inside
expert_gate_up.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize

from grid_blocks import GRID_QTYPES, random_grid_blocks
from runner.backends.cuda.kernels import gpu_available
from runner.backends.limits import SMALL_BATCH_ROWS

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda import gemv as gemv_cuda  # noqa: E402
from runner.backends.cuda.gemv import expert_gate_up, expert_gemv, gemv, gemv_multi  # noqa: E402
from runner.backends.cuda.norm_rope import swiglu  # noqa: E402
from runner.synth.random_blocks import random_tensor  # noqa: E402

QTYPES = [
    QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1,
    QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_NL, QT.IQ4_XS, QT.MXFP4, *GRID_QTYPES,
]
# id -> (N, K given the block size): N off every tile size; K one block, a few, and long rows.
SHAPES = {
    "N1-K1block": (1, lambda block: block),
    "N7-K3blocks": (7, lambda block: 3 * block),
    "N1000-K4096": (1000, lambda block: 4096),
    "N33-K14336": (33, lambda block: 14336),
    "N5-K11008": (5, lambda block: 11008),
}
FLOAT_SHAPES = {"N3-K13": (3, 13), "N9-K1000": (9, 1000)}  # float rows of any length (one-value units)


def weights(rng: np.random.Generator, qtype: QT, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(GGUF bytes [prod(shape[:-1]), row_bytes], float64 values of the same shape) of random valid blocks."""
    if qtype in GRID_QTYPES:  # types runner.synth does not write
        raw = random_grid_blocks(rng, qtype, shape)
    else:
        data = random_tensor(rng, qtype, shape, 0.02)
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(int(np.prod(shape[:-1])), -1)
    return raw, dequantize(raw, qtype).astype(np.float64).reshape(shape)


def assert_close_to_twin(got: cp.ndarray, x: np.ndarray, dense: np.ndarray) -> None:
    x64 = x.astype(np.float64)
    want = x64 @ dense.T
    bound = 1e-5 * (np.abs(x64) @ np.abs(dense).T) + 1e-30
    err = np.abs(cp.asnumpy(got).astype(np.float64) - want)
    bad = err > bound
    assert not bad.any(), f"{bad.sum()} of {bad.size} outside tolerance, worst {np.max(err / bound):.2f} x bound"


def assert_bitwise_equal(a: cp.ndarray, b: cp.ndarray, what: str) -> None:
    a, b = cp.asnumpy(a), cp.asnumpy(b)
    assert a.shape == b.shape, f"{what}: shapes {a.shape} and {b.shape}"
    differ = a.view(np.uint32) != b.view(np.uint32)
    assert not differ.any(), f"{what}: {differ.sum()} of {differ.size} values differ in their bits"


def check_gemv(qtype: QT, n: int, k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    raw, dense = weights(rng, qtype, (n, k))
    w = cp.asarray(raw)
    xs = rng.standard_normal((2 * SMALL_BATCH_ROWS, k)).astype(np.float32)
    xs[3] = 0.0  # an all-zero row
    singles = [gemv(cp.asarray(xs[i : i + 1]), w, qtype, k) for i in range(len(xs))]
    for rows in range(1, SMALL_BATCH_ROWS + 1):
        picks = rng.choice(len(xs), rows, replace=False)  # a different set of neighbours each time
        x = xs[picks]
        y = gemv(cp.asarray(x), w, qtype, k)
        assert y.shape == (rows, n) and y.dtype == cp.float32
        assert_close_to_twin(y, x, dense)
        for i, pick in enumerate(picks):
            assert_bitwise_equal(y[i : i + 1], singles[pick], f"row {i} of {rows} against the row alone")


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_gemv_matches_twin_and_is_batch_invariant(qtype: QT, shape: str) -> None:
    n, k_of = SHAPES[shape]
    check_gemv(qtype, n, k_of(GGML_QUANT_SIZES[qtype][0]), seed=int(qtype) * 100 + n)


@pytest.mark.parametrize("shape", list(FLOAT_SHAPES))
@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.BF16], ids=lambda t: t.name)
def test_gemv_float_rows_of_any_length(qtype: QT, shape: str) -> None:
    n, k = FLOAT_SHAPES[shape]
    check_gemv(qtype, n, k, seed=int(qtype) + k)


def expert_setup(rng, qtypes: tuple[QT, ...], n_expert: int, n_out: int, k: int):
    """Per qtype: a resident expert tensor [n_expert * n_out, row_bytes] on the GPU and its values."""
    made = []
    for qtype in qtypes:
        raw, dense = weights(rng, qtype, (n_expert, n_out, k))
        made.append((cp.asarray(raw), dense))
    return made


def pointers(w: cp.ndarray, experts: np.ndarray, n_out: int) -> cp.ndarray:
    expert_bytes = n_out * w.shape[1]
    return cp.asarray(np.uint64(w.data.ptr) + experts.astype(np.uint64) * np.uint64(expert_bytes), dtype=cp.uint64)


EXPERT_SHAPES = {"E3-N37-K3blocks": (3, 37, lambda block: 3 * block), "E4-N1000-K4096": (4, 1000, lambda block: 4096)}


@pytest.mark.parametrize("shape", list(EXPERT_SHAPES))
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_expert_gemv_and_gate_up_equal_single_rows(qtype: QT, shape: str) -> None:
    n_expert, n_out, k_of = EXPERT_SHAPES[shape]
    k = k_of(GGML_QUANT_SIZES[qtype][0])
    rng = np.random.default_rng(int(qtype) * 7 + n_out)
    (wg, dense_g), (wu, dense_u) = expert_setup(rng, (qtype, qtype), n_expert, n_out, k)
    check_experts(rng, qtype, qtype, wg, dense_g, wu, dense_u, n_expert, n_out, k)


@pytest.mark.parametrize("gate_qtype,up_qtype", [(QT.Q4_K, QT.Q6_K), (QT.IQ4_XS, QT.Q5_K), (QT.Q8_0, QT.F16),
                                                  (QT.IQ2_XXS, QT.Q4_K), (QT.IQ1_M, QT.IQ3_S), (QT.TQ2_0, QT.IQ2_S)],
                         ids=lambda t: t.name)
def test_gate_and_up_of_different_types(gate_qtype: QT, up_qtype: QT) -> None:
    rng = np.random.default_rng(int(gate_qtype) * 64 + int(up_qtype))
    n_expert, n_out, k = 3, 45, 512
    (wg, dense_g), (wu, dense_u) = expert_setup(rng, (gate_qtype, up_qtype), n_expert, n_out, k)
    check_experts(rng, gate_qtype, up_qtype, wg, dense_g, wu, dense_u, n_expert, n_out, k)


def check_experts(rng, gate_qtype, up_qtype, wg, dense_g, wu, dense_u, n_expert: int, n_out: int, k: int) -> None:
    n_tok = 3
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    x_dev = cp.asarray(x)
    for n_pairs in (1, 5, 12):  # the pairs of a 1-token and of multi-token steps, experts repeating
        tok = rng.integers(0, n_tok, n_pairs).astype(np.int32)
        experts = rng.integers(0, n_expert, n_pairs)
        rows = cp.asarray(tok)
        g = expert_gemv(x_dev, rows, pointers(wg, experts, n_out), gate_qtype, n_out, k)
        u = expert_gemv(x_dev, rows, pointers(wu, experts, n_out), up_qtype, n_out, k)
        assert g.shape == (n_pairs, n_out) and g.dtype == cp.float32
        h = expert_gate_up(x_dev, rows, pointers(wg, experts, n_out), pointers(wu, experts, n_out), gate_qtype,
                           up_qtype, n_out, k)
        assert_bitwise_equal(h, swiglu(g, u), "expert_gate_up against swiglu of the two expert_gemv")
        for p, (t, e) in enumerate(zip(tok, experts)):
            assert_close_to_twin(g[p : p + 1], x[t : t + 1], dense_g[e])
            alone = gemv(x_dev[t : t + 1], wg[e * n_out : (e + 1) * n_out], gate_qtype, k)
            assert_bitwise_equal(g[p : p + 1], alone, f"pair {p} of {n_pairs} against gemv of its row and expert")
            alone = gemv(x_dev[t : t + 1], wu[e * n_out : (e + 1) * n_out], up_qtype, k)
            assert_bitwise_equal(u[p : p + 1], alone, f"up pair {p} of {n_pairs} against gemv")


OTHER_LAYOUT = {"columns": "units", "units": "columns"}


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_the_other_layout_is_right_and_batch_invariant_too(qtype: QT, monkeypatch: pytest.MonkeyPatch) -> None:
    """LAYOUTS picks one layout per type from measurements; the other must be as correct."""
    monkeypatch.setitem(gemv_cuda.LAYOUTS, qtype, OTHER_LAYOUT[gemv_cuda.LAYOUTS[qtype]])
    block = GGML_QUANT_SIZES[qtype][0]
    check_gemv(qtype, 7, 3 * block, seed=int(qtype) + 1)
    check_gemv(qtype, 1000, 4096, seed=int(qtype) + 2)
    n_expert, n_out, k = 3, 37, 3 * block
    rng = np.random.default_rng(int(qtype) + 3)
    (wg, dense_g), (wu, dense_u) = expert_setup(rng, (qtype, qtype), n_expert, n_out, k)
    check_experts(rng, qtype, qtype, wg, dense_g, wu, dense_u, n_expert, n_out, k)


@pytest.mark.parametrize("qtype", [QT.F32, QT.Q4_K, QT.Q6_K, QT.IQ2_XXS], ids=lambda t: t.name)
def test_units_layout_gives_the_same_bits_at_any_block_shape(qtype: QT, monkeypatch: pytest.MonkeyPatch) -> None:
    """UNITS_WARPS and UNITS_WARP_COLUMNS move columns between warps and CTAs (a warp owns its columns), so gemv,
    gemv_multi, expert_gemv and expert_gate_up keep their bits, at tile sizes that leave a partial last tile."""
    monkeypatch.setitem(gemv_cuda.LAYOUTS, qtype, "units")
    rng = np.random.default_rng(int(qtype) + 17)
    k = 4 * GGML_QUANT_SIZES[qtype][0] if qtype != QT.F32 else 1024
    (wg, _), (wu, _) = expert_setup(rng, (qtype, qtype), 3, 70, k)
    x = cp.asarray(rng.standard_normal((3, k)).astype(np.float32))
    rows, experts = cp.asarray(np.array([0, 2, 1, 0], dtype=np.int32)), np.array([1, 0, 2, 2])
    g_ptrs, u_ptrs = pointers(wg, experts, 70), pointers(wu, experts, 70)
    results = {}
    for shape in ((16, 2), (4, 2), (1, 2), (4, 1), (16, 1)):
        monkeypatch.setattr(gemv_cuda, "UNITS_WARPS", shape[0])
        monkeypatch.setattr(gemv_cuda, "UNITS_WARP_COLUMNS", shape[1])
        results[shape] = [gemv(x, wg[:37], qtype, k), *gemv_multi(x, [(wg[:37], qtype), (wu[:70], qtype)], [None, None]),
                          expert_gemv(x, rows, g_ptrs, qtype, 70, k),
                          expert_gate_up(x, rows, g_ptrs, u_ptrs, qtype, qtype, 70, k)]
    for shape, got in results.items():
        for what, a, b in zip(("gemv", "multi q", "multi k", "expert_gemv", "gate_up"), results[(16, 2)], got):
            assert_bitwise_equal(b, a, f"{what} at {shape[0]} warps of {shape[1]} columns against 16 of 2")


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q8_0, QT.IQ4_XS], ids=lambda t: t.name)
def test_columns_layout_gives_the_same_bits_at_any_block_size(qtype: QT, monkeypatch: pytest.MonkeyPatch) -> None:
    """COLUMNS_THREADS moves columns between CTAs (16 threads a column, the K slices fixed), and COLUMNS_PER_THREAD
    gives a thread one or two of them, so gemv at 1 and 8 rows, gemv_multi, expert_gemv, expert_gate_up and
    expert_down_combine keep their bits at 64 to 512 threads and 1 or 2 columns a thread, at column counts that
    leave a partial last tile and at row lengths of fewer units than slices."""
    monkeypatch.setitem(gemv_cuda.LAYOUTS, qtype, "columns")
    rng = np.random.default_rng(int(qtype) + 29)
    block = GGML_QUANT_SIZES[qtype][0]
    for k in (2 * block, 4096):
        (wg, _), (wu, _) = expert_setup(rng, (qtype, qtype), 3, 70, k)
        x = cp.asarray(rng.standard_normal((8, k)).astype(np.float32))
        rows, experts = cp.asarray(np.array([0, 2, 1, 0], dtype=np.int32)), np.array([1, 0, 2, 2])
        g_ptrs, u_ptrs = pointers(wg, experts, 70), pointers(wu, experts, 70)
        mix = cp.asarray(rng.random((2, 2)).astype(np.float32))
        results = {}
        for threads, per_thread in ((512, 1), (256, 1), (128, 1), (64, 1), (512, 2), (128, 2), (64, 2)):
            monkeypatch.setattr(gemv_cuda, "COLUMNS_THREADS", threads)
            monkeypatch.setattr(gemv_cuda, "COLUMNS_PER_THREAD", per_thread)
            results[threads, per_thread] = [
                gemv(x[:1], wg[:37], qtype, k), gemv(x, wg[:37], qtype, k),
                *gemv_multi(x[:2], [(wg[:37], qtype), (wu[:70], qtype)], [None, None]),
                expert_gemv(x, rows, g_ptrs, qtype, 70, k), expert_gate_up(x, rows, g_ptrs, u_ptrs, qtype, qtype, 70, k),
                gemv_cuda.expert_down_combine(x, rows, g_ptrs, qtype, 70, k, cp.empty((4, 70), cp.float32), mix)]
        names = ("gemv r1", "gemv r8", "multi q", "multi k", "expert_gemv", "gate_up", "down_combine")
        for (threads, per_thread), got in results.items():
            for what, a, b in zip(names, results[512, 1], got):
                assert_bitwise_equal(b, a, f"{what} at K {k}, {threads} threads, {per_thread} columns a thread")


@pytest.mark.parametrize("threads", [512, 128])
@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.F16], ids=lambda t: t.name)
def test_gate_up_in_one_pass_has_the_bits_of_two(qtype: QT, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """GATE_UP_ONE_PASS reads the gate's and the up's bytes together (columns layout, one unit); the two-pass
    module computes the gate's tile and then the up's: every column has the same bits (F16 takes units: both one)."""
    monkeypatch.setattr(gemv_cuda, "COLUMNS_THREADS", threads)
    rng = np.random.default_rng(int(qtype) + 41)
    k = 2048
    (wg, _), (wu, _) = expert_setup(rng, (qtype, qtype), 4, 300, k)
    x = cp.asarray(rng.standard_normal((3, k)).astype(np.float32))
    rows, experts = cp.asarray(np.array([0, 2, 1, 0, 2], dtype=np.int32)), np.array([1, 0, 3, 2, 1])
    g_ptrs, u_ptrs = pointers(wg, experts, 300), pointers(wu, experts, 300)
    got = {}
    for one_pass in (True, False):
        monkeypatch.setattr(gemv_cuda, "GATE_UP_ONE_PASS", one_pass)
        got[one_pass] = expert_gate_up(x, rows, g_ptrs, u_ptrs, qtype, qtype, 300, k)
    assert_bitwise_equal(got[True], got[False], f"gate_up in one pass against two at {threads} threads")


@pytest.mark.parametrize("n_out", [2048, 300])
@pytest.mark.parametrize("qtype,k", [(QT.Q4_K, 512), (QT.Q6_K, 512), (QT.Q8_0, 256), (QT.Q4_K, 256)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_expert_gemv_in_half_slices_keeps_its_bits(qtype: QT, k: int, n_out: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """EXPERT_HALF_SLICES: rows of at most 8 units launch expert_gemv_half (8 threads a column, every thread on a
    unit) with expert_gemv's bits, in one launch and in a directory graph's two passes."""
    rng = np.random.default_rng(int(qtype) + k + n_out)
    ((w, _),) = expert_setup(rng, (qtype,), 4, n_out, k)
    x = cp.asarray(rng.standard_normal((11, k)).astype(np.float32))
    x[3, : k // 2] = 0.0  # zero sums and sign-carrying zeros reach the slices' adds too
    rows = cp.asarray(np.arange(11, dtype=np.int32))
    ptrs = pointers(w, rng.integers(0, 4, size=11), n_out)
    flags = cp.asarray((np.arange(11) % 3 == 0).astype(np.int32))
    want = expert_gemv(x, rows, ptrs, qtype, n_out, k)
    monkeypatch.setattr(gemv_cuda, "EXPERT_HALF_SLICES", True)
    assert gemv_cuda.half_slices(qtype, k)
    assert_bitwise_equal(expert_gemv(x, rows, ptrs, qtype, n_out, k), want, f"{qtype.name} K {k} in half slices")
    passes = cp.full((11, n_out), np.nan, dtype=cp.float32)
    for value in (0, 1):
        expert_gemv(x, rows, ptrs, qtype, n_out, k, out=passes, passes=(flags, value))
    assert_bitwise_equal(passes, want, f"{qtype.name} K {k} in half slices, two passes")


@pytest.mark.parametrize("min_blocks", [6, 7])
@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K], ids=lambda t: t.name)
def test_gate_up_under_a_register_cap_keeps_its_bits(qtype: QT, min_blocks: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """GATE_UP_MIN_BLOCKS caps the entry's registers (spilling what does not fit): the same instructions, the same
    bits, over more pairs than one wave of the unbounded entry holds at seed48's shape."""
    rng = np.random.default_rng(int(qtype) + 43)
    k = 2048
    (wg, _), (wu, _) = expert_setup(rng, (qtype, qtype), 4, 512, k)
    x = cp.asarray(rng.standard_normal((2, k)).astype(np.float32))
    rows = cp.asarray(np.repeat(np.array([0, 1], dtype=np.int32), 11))
    experts = rng.integers(0, 4, size=22)  # 22 pairs of 64 tiles: 1408 CTAs, two waves even under the cap
    g_ptrs, u_ptrs = pointers(wg, experts, 512), pointers(wu, experts, 512)
    want = expert_gate_up(x, rows, g_ptrs, u_ptrs, qtype, qtype, 512, k)
    monkeypatch.setattr(gemv_cuda, "GATE_UP_MIN_BLOCKS", min_blocks)
    got = expert_gate_up(x, rows, g_ptrs, u_ptrs, qtype, qtype, 512, k)
    assert_bitwise_equal(got, want, f"gate_up at {min_blocks} blocks an SM against unbounded")


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.F16], ids=lambda t: t.name)
def test_two_passes_over_the_pairs_give_one_launchs_bits(qtype: QT) -> None:
    """passes=(pass_of, v): a launch computes only the pairs flagged v and leaves the other rows as they were, so
    the two passes of a directory graph's overlap (held experts, then filled ones) write one launch's bits."""
    rng = np.random.default_rng(int(qtype) + 29)
    k = 2 * GGML_QUANT_SIZES[qtype][0] if qtype != QT.F16 else 512
    (wg, _), (wu, _) = expert_setup(rng, (qtype, qtype), 4, 70, k)
    x = cp.asarray(rng.standard_normal((2, k)).astype(np.float32))
    rows, experts = cp.asarray(np.array([0, 1, 1, 0, 1, 0], dtype=np.int32)), np.array([3, 0, 2, 1, 3, 2])
    g_ptrs, u_ptrs = pointers(wg, experts, 70), pointers(wu, experts, 70)
    flags = cp.asarray(np.array([0, 1, 1, 0, 0, 1], dtype=np.int32))
    whole_h = expert_gate_up(x, rows, g_ptrs, u_ptrs, qtype, qtype, 70, k)
    whole_y = expert_gemv(x, rows, g_ptrs, qtype, 70, k)
    h = cp.full((6, 70), cp.nan, dtype=cp.float32)
    y = cp.full((6, 70), cp.nan, dtype=cp.float32)
    expert_gate_up(x, rows, g_ptrs, u_ptrs, qtype, qtype, 70, k, out=h, passes=(flags, 0))
    expert_gemv(x, rows, g_ptrs, qtype, 70, k, out=y, passes=(flags, 0))
    held = cp.asnumpy(flags) == 0
    assert np.isnan(cp.asnumpy(h)[~held]).all() and np.isnan(cp.asnumpy(y)[~held]).all(), "a pass wrote other rows"
    expert_gate_up(x, rows, g_ptrs, u_ptrs, qtype, qtype, 70, k, out=h, passes=(flags, 1))
    expert_gemv(x, rows, g_ptrs, qtype, 70, k, out=y, passes=(flags, 1))
    assert_bitwise_equal(h, whole_h, "gate_up in two passes against one launch")
    assert_bitwise_equal(y, whole_y, "expert_gemv in two passes against one launch")


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K], ids=lambda t: t.name)
def test_long_rows_take_the_units_layout_and_short_rows_keep_theirs(qtype: QT, monkeypatch: pytest.MonkeyPatch) -> None:
    """UNITS_FROM_ROW: products of rows at least that long take the units layout (4 warps a block, the arm
    an end-to-end run would measure), shorter ones their type's; each is right, and the expert kernels keep
    their agreement with gemv at either length."""
    monkeypatch.setattr(gemv_cuda, "UNITS_FROM_ROW", 2048)
    monkeypatch.setattr(gemv_cuda, "UNITS_WARPS", 4)
    rng = np.random.default_rng(int(qtype) + 41)
    for k, seed in ((2048, 1), (512, 2)):
        check_gemv(qtype, 300, k, seed=int(qtype) + seed)
        (wg, dense_g), (wu, dense_u) = expert_setup(rng, (qtype, qtype), 3, 70, k)
        check_experts(rng, qtype, qtype, wg, dense_g, wu, dense_u, 3, 70, k)
    x = cp.asarray(rng.standard_normal((1, 2048)).astype(np.float32))
    raw, _ = weights(rng, qtype, (64, 2048))
    long_rows = gemv(x, cp.asarray(raw), qtype, 2048)
    monkeypatch.setitem(gemv_cuda.LAYOUTS, qtype, "units")
    monkeypatch.setattr(gemv_cuda, "UNITS_FROM_ROW", None)
    assert_bitwise_equal(long_rows, gemv(x, cp.asarray(raw), qtype, 2048), "K 2048 under UNITS_FROM_ROW against units")


def test_gate_and_up_in_different_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(gemv_cuda.LAYOUTS, QT.Q4_K, "columns")
    monkeypatch.setitem(gemv_cuda.LAYOUTS, QT.Q6_K, "units")
    rng = np.random.default_rng(11)
    (wg, dense_g), (wu, dense_u) = expert_setup(rng, (QT.Q4_K, QT.Q6_K), 2, 70, 1024)
    check_experts(rng, QT.Q4_K, QT.Q6_K, wg, dense_g, wu, dense_u, 2, 70, 1024)


def test_output_buffer_is_filled_in_place() -> None:
    rng = np.random.default_rng(5)
    raw, dense = weights(rng, QT.Q4_K, (40, 256))
    x = rng.standard_normal((2, 256)).astype(np.float32)
    out = cp.full((2, 40), cp.nan, dtype=cp.float32)
    assert gemv(cp.asarray(x), cp.asarray(raw), QT.Q4_K, 256, out=out) is out
    assert_close_to_twin(out, x, dense)


def test_every_listed_type_is_supported_and_no_other() -> None:
    assert gemv_cuda.SUPPORTED_QTYPES == frozenset(QTYPES)


def test_unsupported_type_is_a_value_error_naming_the_supported() -> None:
    x = cp.zeros((1, 32), cp.float32)
    w = cp.zeros((1, GGML_QUANT_SIZES[QT.Q8_1][1]), cp.uint8)
    with pytest.raises(ValueError, match="Q8_1.*Q4_K"):
        gemv(x, w, QT.Q8_1, 32)


def _q4k(rows: int = 2) -> cp.ndarray:
    return cp.zeros((rows, 144), cp.uint8)


@pytest.mark.parametrize(
    "x, w, message",
    [
        (lambda: cp.zeros((1, 256), cp.float64), _q4k, "float32"),
        (lambda: cp.zeros((256, 2), cp.float32).T, _q4k, "C-contiguous"),
        (lambda: cp.zeros((256,), cp.float32), _q4k, "2-D"),
        (lambda: cp.zeros((9, 256), cp.float32), _q4k, "1 to 8 rows"),
        (lambda: cp.zeros((0, 256), cp.float32), _q4k, "1 to 8 rows"),
        (lambda: cp.zeros((1, 512), cp.float32), _q4k, "512 columns"),
        (lambda: cp.zeros((1, 256), cp.float32), lambda: cp.zeros((2, 144), cp.int8), "uint8"),
        (lambda: cp.zeros((1, 256), cp.float32), lambda: cp.zeros((2, 145), cp.uint8), "take 144 bytes"),
        (lambda: cp.zeros((1, 256), cp.float32), lambda: cp.zeros((2, 288), cp.uint8)[:, :144], "C-contiguous"),
        (lambda: cp.zeros((1, 256), cp.float32), lambda: cp.zeros(2 * 144 + 16, cp.uint8)[8 : 8 + 288].reshape(2, 144),
         "16-byte aligned"),
        (lambda: cp.zeros(257, cp.float32)[1:].reshape(1, 256), _q4k, "x must be 16-byte aligned"),
    ],
    ids=["x-dtype", "x-strided", "x-1d", "too-many-rows", "no-rows", "k-mismatch", "w-dtype", "w-row-bytes",
         "w-strided", "w-misaligned", "x-misaligned"],
)
def test_gemv_rejects_bad_arguments(x, w, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        gemv(x(), w(), QT.Q4_K, 256)


def test_gemv_rejects_a_wrong_output_buffer() -> None:
    with pytest.raises(AssertionError, match="out must be"):
        gemv(cp.zeros((1, 256), cp.float32), _q4k(), QT.Q4_K, 256, out=cp.zeros((2, 2), cp.float32))


def test_expert_wrappers_reject_bad_pair_tables() -> None:
    x = cp.zeros((2, 256), cp.float32)
    rows, ptrs = cp.zeros(3, cp.int32), cp.zeros(3, cp.uint64)
    with pytest.raises(AssertionError, match="int32"):
        expert_gemv(x, rows.astype(cp.int64), ptrs, QT.Q4_K, 4, 256)
    with pytest.raises(AssertionError, match="uint64"):
        expert_gemv(x, rows, ptrs.astype(cp.int64), QT.Q4_K, 4, 256)
    with pytest.raises(AssertionError, match="3 rows but"):
        expert_gate_up(x, rows, ptrs, ptrs[:2], QT.Q4_K, QT.Q4_K, 4, 256)
    with pytest.raises(AssertionError, match="columns"):
        expert_gemv(cp.zeros((2, 512), cp.float32), rows, ptrs, QT.Q4_K, 4, 256)


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q8_0, QT.F32], ids=lambda t: t.name)
def test_a_bias_added_in_the_launch_has_the_bits_of_adding_it_after(qtype: QT) -> None:
    rng = np.random.default_rng(int(qtype))
    raw, _ = weights(rng, qtype, (1000, 4096))
    w = cp.asarray(raw)
    bias = cp.asarray(rng.standard_normal(1000).astype(np.float32))
    for rows in range(1, 9):
        x = cp.asarray(rng.standard_normal((rows, 4096)).astype(np.float32))
        after = gemv(x, w, qtype, 4096)
        after += bias
        assert cp.array_equal(gemv(x, w, qtype, 4096, bias=bias).view(cp.uint32), after.view(cp.uint32)), rows
