"""Products of 1..8 float32 rows with GGUF-quantized weights on the GPU, straight from the blocks (cuda/gemv.cu).

The decode and speculative-verify path: `gemv` (a resident matrix), `gemv_multi` (two or three resident
matrices times the same rows in one launch: attention's q, k and v), `expert_gemv` (one matrix per
(token, expert) pair, addressed by device pointers) and `expert_gate_up` (silu(gate) * up fused).
The numpy twin is `x @ gguf.quants.dequantize(w).T`.

Batch invariant, bit for bit: a column's result depends only on (qtype, row length, the type's
layout, its x row, its bytes), never on how many rows are in the batch, which other rows or pairs
are there, or which of the three functions computed it (they share one dot product; see gemv.cu).

Accuracy against the float64 twin: |y - ref| <= 1e-5 * (|x| @ |W|^T) + 1e-30. The kernels multiply
and add in float32 in their own order (a lane sums row_length / 16 or / 32 products in order,
scale-only types first summing 8 integer codes times x and multiplying by the scale once; then 16
K-slice sums added in order, or a 5-level shuffle tree), so each term carries a few 2^-24 roundings
and their sum drifts like a random walk: about sqrt(row_length / 16) * 2^-24 ~ 2e-6 of |x| @ |W|
at row_length 14336, inside 1e-5 with room. The 1e-30 covers all-zero rows.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.cuda.kernels import CudaUnavailable, load_module
from runner.backends.limits import SMALL_BATCH_ROWS

if TYPE_CHECKING:
    import cupy

_THREADS = 512  # GEMV_THREADS' default in gemv.cu (a module compiled for another count gets a define)
# Threads of a CTA in a launch with a columns-layout matrix: 16 a column (gemv.cu's GEMV_SEGMENTS K slices fix the
# bits, not the threads), so 512 give 32-column tiles and 128 give 8. Fewer columns a CTA spread a small decode
# product over more of the SMs: a 2048 x 2048 Q4_K product at 512 runs 64 CTAs on an H100's 132 SMs (ncu,
# docs/perf/2026-12-07f-seed48-gemv-ctas-h100.md). Such a launch's units-layout matrices take 2 columns a warp.
# 128 on an H100 (docs/perf/2026-12-07h-seed48-pdl-split-ahead-h100.md): resident seed48 5.05 -> 4.78 ms of GPU a
# token (4.70 -> 4.53 with PDL); the LM head 178 -> 125 us, the 10 pairs' gate-up 26.7 -> 19.0 us.
COLUMNS_THREADS = 128
# Columns a thread of the columns layout computes, 1 or 2 (its rows' bytes in flight together, each column with its
# own sums: the same bits): 2 halves a launch's CTAs and doubles the loads a thread has in flight (ncu: the decode
# products stall on L1TEX 61% of the time with one unit a thread in flight). At one row it loses on an H100 (a
# 2048 x 2048 Q4_K product 9.9 -> 10.9 us at 128 threads; docs/perf/2026-12-07h-seed48-pdl-split-ahead-h100.md);
# it wins only the LM head at 4 to 8 rows.
COLUMNS_PER_THREAD = 1
# expert_gate_up reads the gate's and the up's bytes in one pass when both are the same unit in the columns layout
# (each thread holds a unit of each in flight); off, the gate's tile and then the up's, as before 2026-12-07f. The
# same bits either way. On: seed48 offloaded took 7.42 ms of GPU a token on the H100 of gpu-call-33 against 7.99
# on gpu-call-32's (other boxes; no same-box A/B yet), while bench_gemv_cuda's 10-pair launch took 26.6 us at 512
# threads (its 160 CTAs at 99 registers need two waves) against 22.8 before, 19.2 at 128 threads.
GATE_UP_ONE_PASS = True
# CTAs of expert_gate_up an SM must hold at once (its __launch_bounds__ minimum; None: no bound): a register cap of
# 65536 / (threads x blocks). At 128 threads the one-pass Q4_K entry took 96 registers, so an SM held 5 CTAs, 660
# on an H100: seed48's 11 pairs of 64 tiles (704 CTAs) needed two waves, the second of 44 (ncu, 07i: 22.7 us a
# layer, the largest kernel of a token). Since 2026-12-08's branch-free K-quant scale decode (gemv.cu
# k_scale_min_of) ptxas gives it 80 unbounded, 6 an SM already; 7 caps it at 72. The same instructions, the same
# bits; not yet timed (docs/wip/gpu-call-46.sh), so no bound by default.
GATE_UP_MIN_BLOCKS: int | None = None
# expert_gemv of rows of at most 8 units in the columns layout (K 512 of the 64-value units: seed48's expert down
# products) launches expert_gemv_half: 8 threads a column instead of 16, whose K slices 8 to 15 hold no unit there,
# so half the CTAs (seed48: 1408 for 11 pairs instead of 2816, 2.4 waves of 9 CTAs an SM at 56 registers) and every
# thread on a unit. The same bits (gemv.cu says why); not yet timed (docs/wip/gpu-call-46.sh), so off.
EXPERT_HALF_SLICES = False
_HALF_SLICES = 8  # gemv.cu HALF_SLICES
# Warps of a CTA when every matrix of a launch takes the units layout (each warp owns its columns, so the count
# changes which CTA computes a column, not its bits): 16 is the 512 threads of the columns layout; fewer give a
# matrix of N columns N / (2 * warps) CTAs, more of the SMs for the small decode products. 4 warps of 2 columns
# take a 2048 x 2048 Q4_K product from 7.8 to 5.6 us on an H100 (docs/perf/2026-12-07d-seed48-decode-keys-
# overlap-h100.md), but only with UNITS_FROM_ROW below: the defaults keep the shape every type had.
UNITS_WARPS = 16
UNITS_WARP_COLUMNS = 2  # and the columns each of those warps owns, 2 or 1 (1: twice the warps, x read once a column)
# The normed router's launch (gemv_norm_route) when its matrix takes the units layout (a float32 router): the columns
# each warp owns, and the units each lane keeps in flight (gemv.cu GEMV_LOAD_AHEAD). Its CTAs need a thread an
# expert for the ranking, so a 512-expert router runs 512-thread CTAs of 32 columns: 16 CTAs on an H100's 132 SMs,
# and a lane's 8 units of a 2048-value row arrive one after another (ncu: 16 us a layer on resident seed48,
# docs/perf/2026-12-07i-seed48-defaults-locality-mtp-h100.md). 1 column a warp gives 32 CTAs, and 8 units ahead
# (spill-free at 84 registers for one row, 112 for four) ask for a lane's whole row at once. The same bits at any
# setting; not yet timed (docs/wip/README.md), so the defaults keep the launch as it was.
ROUTE_WARP_COLUMNS = 2
ROUTE_LOAD_AHEAD = 1
# And the warps of those CTAs that compute columns (gemv.cu GEMV_TILE_WARPS; None: all 16): the rest only norm x and,
# in the last CTA, rank. 4 warps of 1 column give a 512-expert router 128 CTAs of 4 columns, one a SM, where 16
# warps gave 32 of 16: its 4 MB of float32 read by nearly every SM instead of a quarter of them. The same bits (a
# column's warp computes it as before); not yet timed (docs/wip/gpu-call-46.sh), so all warps by default.
ROUTE_TILE_WARPS: int | None = None
_MAX_PAIRS = 65535  # pairs are grid.y

# The unit (cuda/gemv.cu) that reads each type; float rows whose length is not a multiple of 8
# take the one-value units.
_UNITS: dict[QT, str] = {
    QT.F32: "UnitF32", QT.F16: "UnitF16", QT.BF16: "UnitBF16", QT.Q8_0: "UnitQ8_0", QT.Q4_0: "UnitQ4_0",
    QT.Q4_1: "UnitQ4_1", QT.Q5_0: "UnitQ5_0", QT.Q5_1: "UnitQ5_1", QT.Q2_K: "UnitQ2_K", QT.Q3_K: "UnitQ3_K",
    QT.Q4_K: "UnitQ4_K", QT.Q5_K: "UnitQ5_K", QT.Q6_K: "UnitQ6_K", QT.IQ4_NL: "UnitIQ4_NL",
    QT.IQ4_XS: "UnitIQ4_XS", QT.MXFP4: "UnitMXFP4",
}
# Types whose unit is UnitBlock<Block...> (gemv.cu): blocks.cuh's decoder, one 32-value sub-block a unit.
_BLOCK_QTYPES = (QT.IQ1_S, QT.IQ1_M, QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ3_XXS, QT.IQ3_S, QT.TQ1_0, QT.TQ2_0)
_UNITS.update({qtype: f"Unit{qtype.name}" for qtype in _BLOCK_QTYPES})
_SCALAR_UNITS: dict[QT, str] = {QT.F32: "UnitF32S", QT.F16: "UnitF16S", QT.BF16: "UnitBF16S"}
SUPPORTED_QTYPES: frozenset[QT] = frozenset(_UNITS)
# Values a unit of each type reads (cuda/gemv.cu's Unit::UNIT; tests/test_gemv_launch_shape.py checks them).
UNIT_VALUES: dict[QT, int] = {qtype: 32 for qtype in _UNITS}
UNIT_VALUES.update({QT.F32: 8, QT.F16: 8, QT.BF16: 8, QT.Q2_K: 128, QT.Q3_K: 128, QT.Q4_K: 64, QT.Q5_K: 64,
                    QT.Q6_K: 64, QT.IQ4_XS: 64})
ALL_UNITS: tuple[str, ...] = (*_UNITS.values(), *_SCALAR_UNITS.values())
# How a CTA's 16 warps share its 32 columns (cuda/gemv.cu): "columns" (a lane per column, the warps
# split K) or "units" (a warp per two columns, lanes split K). Chosen per type from the H200 runs in
# docs/perf/2026-12-02-gemv-cuda-h200.md; both are batch invariant, and all three functions use the
# same entry for a type, so changing an entry changes results (by rounding) but not their agreement.
LAYOUTS: dict[QT, str] = {qtype: "columns" for qtype in _UNITS}
LAYOUTS.update({QT.F32: "units", QT.F16: "units", QT.BF16: "units"})
# The UnitBlock types read bytes, not 16-byte spans: in "units" a warp's lanes read neighbouring
# sub-blocks of one row (a few cache lines per load), in "columns" 32 rows. Not yet measured.
LAYOUTS.update({qtype: "units" for qtype in _BLOCK_QTYPES})
# Rows of at least this many values take the units layout whatever LAYOUTS says of their type (None: LAYOUTS
# alone). A units row of K values has K / UNIT units for a warp's 32 lanes: at K 2048 a Q4_K row gives every
# lane one and the units layout at 4 warps beats columns (5.6 against 7.8 us), at K 512 (the expert down
# products) 8 lanes of 32 work and it loses (23 against 10 us), so the layout follows the row length. Off until
# an end-to-end run says so (with UNITS_WARPS = 4; not yet run: docs/wip/README.md).
UNITS_FROM_ROW: int | None = None


def layout_of(qtype: QT, row_length: int) -> str:
    """The layout of a product of `qtype` rows of `row_length` values: LAYOUTS' entry, or units from UNITS_FROM_ROW."""
    if UNITS_FROM_ROW is not None and row_length >= UNITS_FROM_ROW:
        return "units"
    return LAYOUTS[qtype]


def gemv(x: "cupy.ndarray", w: "cupy.ndarray", qtype: QT | int, row_length: int,
         out: "cupy.ndarray | None" = None, bias: "cupy.ndarray | None" = None,
         residual: "cupy.ndarray | None" = None) -> "cupy.ndarray":
    """y [R, N] = x [R, K] (float32, 1 <= R <= 8) times w [N, row_bytes] (GGUF blocks of `qtype`) transposed,
    plus bias float32 [N] when given, then residual + that when residual float32 [R, N] is given (a layer's
    skip connection): in the same launch, with the bits of adding them after, in that order."""
    cp = _cupy()
    qtype = _qtype(qtype)
    unit, row_bytes = _layout(qtype, row_length)
    _check_x(cp, x, row_length, unit)
    rows = x.shape[0]
    assert 1 <= rows <= SMALL_BATCH_ROWS, f"gemv takes 1 to {SMALL_BATCH_ROWS} rows, got {rows}"
    _check_matrix(cp, w, qtype, row_length, row_bytes)
    n = w.shape[0]
    if bias is not None:
        assert bias.dtype == cp.float32 and bias.shape == (n,) and bias.flags.c_contiguous, (
            f"bias must be contiguous float32 [{n}], got {bias.dtype} {bias.shape}")
    if residual is not None:
        assert residual.dtype == cp.float32 and residual.shape == (rows, n) and residual.flags.c_contiguous, (
            f"residual must be contiguous float32 [{rows}, {n}], got {residual.dtype} {residual.shape}")
    out = _output(cp, out, (rows, n))
    if n:
        layout = layout_of(qtype, row_length)
        shape = _block_shape(layout)
        _module_kernel(unit, layout, f"gemv_r{rows}", shape)(
            (-(-n // _tile(shape)),), (shape[0],),
            (w, np.int64(row_bytes), np.int32(n), np.int32(row_length), x, out,
             bias if bias is not None else np.uint64(0), residual if residual is not None else np.uint64(0)),
        )
    return out


MAX_MULTI = 3  # matrices gemv_multi takes (MULTI_UNIT0..2 in gemv.cu)
ROUTE_MAX_EXPERTS = 512  # route.cuh's ROUTE_MAX_EXPERTS (route_cuda.MAX_EXPERTS)
NORMED_MAX_ROWS = 4  # rows of the normed entries (gemv_multi_norm_r1..4, gemv_norm_route_r1..4)
_STATIC_SHARED = 48 * 1024  # a kernel's shared memory without the opt-in; beyond it (up to the device's) it asks


def gemv_multi(x: "cupy.ndarray", matrices: "Sequence[tuple[cupy.ndarray, QT | int]]",
               biases: "Sequence[cupy.ndarray | None]") -> "list[cupy.ndarray]":
    """[gemv(x, w, qtype, K, bias=b) for each (w, qtype), b] in one launch, bit for bit (the same tiles): two or
    three matrices of rows of x's length K (attention's q, k and v), 1 <= R <= 8 rows; None: no bias."""
    rows, k = x.shape
    assert 1 <= rows <= SMALL_BATCH_ROWS, f"gemv_multi takes 1 to {SMALL_BATCH_ROWS} rows, got {rows}"
    units, tiles, args, outs, shape = _multi_launch(x, matrices, biases)
    if sum(tiles):
        _multi_kernel(units, f"gemv_multi_r{rows}", shape)(
            (sum(tiles),), (shape[0],), (np.int32(k), x, np.int32(tiles[0]), np.int32(tiles[1]), *args))
    return outs


def gemv_multi_normed(x: "cupy.ndarray", norm_w: "cupy.ndarray", eps: float,
                      matrices: "Sequence[tuple[cupy.ndarray, QT | int]]",
                      biases: "Sequence[cupy.ndarray | None]") -> "list[cupy.ndarray]":
    """gemv_multi(norm_rope_cuda.rms_norm(x, norm_w, eps), matrices, biases) in one launch, bit for bit: every CTA
    norms the rows itself (1 <= R <= NORMED_MAX_ROWS; `normed_fits` says whether its shared memory holds them)."""
    cp = _cupy()
    rows, k = x.shape
    assert 1 <= rows <= NORMED_MAX_ROWS, f"gemv_multi_normed takes 1 to {NORMED_MAX_ROWS} rows, got {rows}"
    _check_norm(cp, norm_w, k)
    units, tiles, args, outs, shape = _multi_launch(x, matrices, biases)
    if sum(tiles):
        kernel = _normed_kernel(_multi_kernel(units + (("norm", ""),), f"gemv_multi_norm_r{rows}", shape), rows * k)
        kernel((sum(tiles),), (shape[0],),
               (np.int32(k), x, norm_w, np.float64(eps), np.int32(tiles[0]), np.int32(tiles[1]), *args),
               shared_mem=rows * k * 4)
    return outs


def normed_fits(rows: int, k: int) -> bool:
    """Whether a normed entry takes R rows of K values: at most NORMED_MAX_ROWS rows, held in its shared memory
    beside its tile (an H100 gives a block 227 KB)."""
    return 1 <= rows <= NORMED_MAX_ROWS and rows * k * 4 <= _max_shared() - _STATIC_SHARED // 2


def _multi_launch(x, matrices, biases):
    """gemv_multi's (units, tiles, arguments after the tiles, outputs, block shape), checked."""
    cp = _cupy()
    assert 2 <= len(matrices) <= MAX_MULTI and len(biases) == len(matrices), (
        f"gemv_multi takes 2 to {MAX_MULTI} matrices and a bias (or None) each, got {len(matrices)} and {len(biases)}")
    rows, k = x.shape
    units, args, columns, outs = [], [], [], []
    for (w, qtype), bias in zip(matrices, biases):
        qtype = _qtype(qtype)
        unit, row_bytes = _layout(qtype, k)
        _check_x(cp, x, k, unit)
        _check_matrix(cp, w, qtype, k, row_bytes)
        n = w.shape[0]
        if bias is not None:
            assert bias.dtype == cp.float32 and bias.shape == (n,) and bias.flags.c_contiguous, (
                f"bias must be contiguous float32 [{n}], got {bias.dtype} {bias.shape}")
        y = cp.empty((rows, n), dtype=cp.float32)
        units.append((unit, layout_of(qtype, k)))
        columns.append(n)
        args += [w, np.int64(row_bytes), np.int32(n), y, bias if bias is not None else np.uint64(0)]
        outs.append(y)
    if len(matrices) == 2:  # the third slot repeats the second's unit, with no blocks
        units.append(units[1])
        args += [args[-5], args[-4], np.int32(0), args[-2], np.uint64(0)]
    shape = _block_shape(*(layout for _, layout in units))
    return tuple(units), [-(-n // _tile(shape)) for n in columns], args, outs, shape


def gemv_norm_route(x: "cupy.ndarray", norm_w: "cupy.ndarray", eps: float, w: "cupy.ndarray", qtype: QT | int,
                    probs_bias: "cupy.ndarray | None", gating: str, n_used: int, n_groups: int, n_group_used: int,
                    norm: bool, scale: float, beside: bool = False) -> "tuple[cupy.ndarray, cupy.ndarray, cupy.ndarray]":
    """A MoE layer's router in one launch: (h, ids, weights) with h = norm_rope_cuda.rms_norm(x, norm_w, eps) and
    (ids, weights) = route_cuda.route(gemv(h, w, qtype, K), probs_bias, gating, ...), bit for bit. The last CTA
    to finish ranks (last_block_counters.ROUTER), so two of these must not run at once, but one `beside` (its own
    counter: a prefetch's guess on a stream of its own). `norm_route_fits` says whether a router takes it."""
    cp = _cupy()
    from runner.backends.cuda import last_block_counters, route as route_cuda  # CuPy's, imported once CuPy is there
    qtype = _qtype(qtype)
    rows, k = x.shape
    assert norm_route_fits(rows, k, w.shape[0], qtype), (
        f"gemv_norm_route cannot take {rows} rows of {k} values and {w.shape[0]} experts")
    unit, row_bytes = _layout(qtype, k)
    _check_x(cp, x, k, unit)
    _check_matrix(cp, w, qtype, k, row_bytes)
    _check_norm(cp, norm_w, k)
    n = w.shape[0]
    bias, *selection = route_cuda.selection_args(n, probs_bias, gating, n_used, n_groups, n_group_used, norm, scale)
    h = cp.empty((rows, k), dtype=cp.float32)
    logits = cp.empty((rows, n), dtype=cp.float32)
    ids = cp.empty((rows, n_used), dtype=cp.int32)
    weights = cp.empty((rows, n_used), dtype=cp.float32)
    layout = layout_of(qtype, k)
    shape = _route_shape(layout)
    slot = last_block_counters.ROUTER_BESIDE if beside else last_block_counters.ROUTER
    counter = last_block_counters.counters()[slot:]
    tile_warps = _route_tile_warps(layout)
    kernel = _normed_kernel(
        _route_kernel(unit, layout, f"gemv_norm_route_r{rows}", shape, _route_ahead(layout), tile_warps), rows * k)
    kernel((-(-n // _tile(shape, tile_warps)),), (shape[0],),
           (w, np.int64(row_bytes), np.int32(n), np.int32(k), x, norm_w, np.float64(eps), h, logits, counter, bias,
            *selection, ids, weights), shared_mem=rows * k * 4)
    return h, ids, weights


def norm_route_fits(rows: int, k: int, n_expert: int, qtype: QT | int) -> bool:
    """Whether gemv_norm_route takes this router: normed_fits, and a CTA's threads (its block shape) at least 64 and
    at least one per expert, for its last CTA's ranking."""
    threads = _route_shape(layout_of(_qtype(qtype), k))[0]
    return normed_fits(rows, k) and n_expert <= min(threads, ROUTE_MAX_EXPERTS) and threads >= 64


def route_defines(qtype: QT | int, row_length: int) -> tuple[str, ...]:
    """The -D defines of the module holding gemv_norm_route for a router of `qtype` rows of `row_length` values."""
    qtype = _qtype(qtype)
    layout = layout_of(qtype, row_length)
    return _route_module_defines(_layout(qtype, row_length)[0], layout, _route_shape(layout), _route_ahead(layout),
                                 _route_tile_warps(layout))


def _route_shape(layout: str) -> tuple[int, int]:
    """The router launch's block shape: _block_shape's, but in the units layout a thread an expert of the most the
    ranking takes (ROUTE_MAX_EXPERTS, whatever UNITS_WARPS says: a warp's columns have the same bits at any warp
    count) and ROUTE_WARP_COLUMNS a warp."""
    assert ROUTE_WARP_COLUMNS in (1, 2), f"ROUTE_WARP_COLUMNS must be 1 or 2, got {ROUTE_WARP_COLUMNS}"
    return (ROUTE_MAX_EXPERTS, ROUTE_WARP_COLUMNS) if layout == "units" else _block_shape(layout)


def _route_tile_warps(layout: str) -> int | None:
    """Warps of the router's CTA that compute columns: ROUTE_TILE_WARPS in the units layout, else None (all)."""
    if layout != "units" or ROUTE_TILE_WARPS is None:
        return None
    assert ROUTE_TILE_WARPS in (1, 2, 4, 8, 16), f"ROUTE_TILE_WARPS must be 1, 2, 4, 8 or 16, got {ROUTE_TILE_WARPS}"
    return ROUTE_TILE_WARPS


def _route_ahead(layout: str) -> int:
    """Units a lane of the router's launch keeps in flight: ROUTE_LOAD_AHEAD in the units layout, else 1."""
    assert 1 <= ROUTE_LOAD_AHEAD <= 8, f"ROUTE_LOAD_AHEAD must be 1 to 8, got {ROUTE_LOAD_AHEAD}"
    # 8 registers a float32 unit a column: past 8 units a lane, four rows' entry spills at 512 threads
    assert ROUTE_LOAD_AHEAD * ROUTE_WARP_COLUMNS <= 8, (
        f"ROUTE_LOAD_AHEAD {ROUTE_LOAD_AHEAD} at {ROUTE_WARP_COLUMNS} columns a warp holds over 8 units a lane")
    return ROUTE_LOAD_AHEAD if layout == "units" else 1


def expert_gemv(x: "cupy.ndarray", rows: "cupy.ndarray", w_ptrs: "cupy.ndarray", qtype: QT | int, n_out: int,
                row_length: int, out: "cupy.ndarray | None" = None,
                passes: "tuple[cupy.ndarray, int] | None" = None) -> "cupy.ndarray":
    """y [P, n_out] with y[p] = x[rows[p]] times W_p^T, one launch for all P pairs; with passes (pass_of int32
    [P], pass), only the pairs whose pass_of is `pass` (the others' rows of `out` are left as they are).

    rows: int32 [P], each in [0, len(x)) (not checked: that would sync); w_ptrs: uint64 [P], the device
    address of pair p's [n_out, row_bytes] matrix, aligned as a row of the type is in a CuPy allocation.
    """
    cp = _cupy()
    pairs, _, launch = _expert_launch(cp, "expert_gemv", x, rows, w_ptrs, qtype, n_out, row_length, passes)
    out = _output(cp, out, (pairs, n_out))
    launch(out)
    return out


def _expert_launch(cp, name: str, x, rows, w_ptrs, qtype: QT | int, n_out: int, row_length: int, passes) -> tuple:
    """(pairs, column tiles, launch(y, *more)) of the expert kernel `name` (expert_gemv's grid and arguments, then
    `more`), its operands checked; the launch is a no-op without pairs or columns."""
    qtype = _qtype(qtype)
    unit, row_bytes = _layout(qtype, row_length)
    _check_x(cp, x, row_length, unit)
    pairs = _check_pairs(cp, rows, w_ptrs)
    layout = layout_of(qtype, row_length)
    shape = _block_shape(layout)
    tiles = -(-n_out // _tile(shape))
    if name == "expert_gemv" and half_slices(qtype, row_length):
        name, tiles = "expert_gemv_half", -(-n_out // (shape[0] // _HALF_SLICES))

    def launch(y, *more) -> None:
        if pairs and n_out:
            _module_kernel(unit, layout, name, shape)(
                (tiles, pairs), (shape[0],),
                (w_ptrs, rows, np.int64(row_bytes), np.int32(n_out), np.int32(row_length), x, y,
                 *_pass_args(cp, passes, pairs), *more))
    return pairs, tiles, launch


def half_slices(qtype: QT | int, row_length: int) -> bool:
    """Whether expert_gemv takes expert_gemv_half for rows of `row_length` values of `qtype`: EXPERT_HALF_SLICES on,
    the columns layout at one column a thread, and at most 8 units a row (gemv.cu's slices 8 to 15 empty)."""
    qtype = _qtype(qtype)
    return (EXPERT_HALF_SLICES and layout_of(qtype, row_length) == "columns" and COLUMNS_PER_THREAD == 1
            and row_length <= _HALF_SLICES * UNIT_VALUES[qtype])


def expert_down_combine(x: "cupy.ndarray", rows: "cupy.ndarray", w_ptrs: "cupy.ndarray", qtype: QT | int, n_out: int,
                        row_length: int, y: "cupy.ndarray", weights: "cupy.ndarray",
                        residual: "cupy.ndarray | None" = None, shared: bool = False,
                        passes: "tuple[cupy.ndarray, int] | None" = None,
                        out: "cupy.ndarray | None" = None) -> "cupy.ndarray":
    """route_cuda.combine(expert_gemv(x, rows, w_ptrs, ..., out=y, passes=passes), weights, residual=residual,
    shared=shared) bit for bit, the sum done by each column tile's last block: out [T, n_out] (T = weights' rows).
    With passes, call it once per pass with the same y and the same out: whichever launch completes a tile's pairs
    writes its sum (each pass's launch counts only its own pairs). Two such launches must not run at once
    (last_block_counters.COMBINE)."""
    cp = _cupy()
    from runner.backends.cuda import last_block_counters  # CuPy's, imported once CuPy is there

    pairs, tiles, launch = _expert_launch(cp, "expert_down_combine", x, rows, w_ptrs, qtype, n_out, row_length, passes)
    y = _output(cp, y, (pairs, n_out))
    n_tok, k = weights.shape
    assert weights.dtype == cp.float32 and weights.flags.c_contiguous, "weights must be contiguous float32 [T, k]"
    assert pairs == n_tok * (k + 1 if shared else k), f"{pairs} pairs for weights {weights.shape}, shared {shared}"
    if residual is not None:
        assert residual.dtype == cp.float32 and residual.shape == (n_tok, n_out) and residual.flags.c_contiguous, (
            f"residual must be contiguous float32 [{n_tok}, {n_out}]")
    out = _output(cp, out, (n_tok, n_out))
    counters = last_block_counters.counters()[last_block_counters.COMBINE]
    assert tiles <= counters.size, f"{tiles} column tiles, {counters.size} counters"
    launch(y, weights, residual if residual is not None else np.uint64(0), out, np.int32(n_tok), np.int32(k),
           np.int32(bool(shared)), counters)
    return out


def expert_gate_up(x: "cupy.ndarray", rows: "cupy.ndarray", gate_ptrs: "cupy.ndarray", up_ptrs: "cupy.ndarray",
                   qtype_gate: QT | int, qtype_up: QT | int, n_ff: int, row_length: int,
                   out: "cupy.ndarray | None" = None,
                   passes: "tuple[cupy.ndarray, int] | None" = None) -> "cupy.ndarray":
    """h [P, n_ff] = silu(x[rows[p]] G_p^T) * (x[rows[p]] U_p^T), in one launch; bit-identical to
    norm_rope_cuda.swiglu of the two expert_gemv results. Gate and up may differ in type. passes: as
    expert_gemv's."""
    cp = _cupy()
    qtype_gate, qtype_up = _qtype(qtype_gate), _qtype(qtype_up)
    gate_unit, gate_row_bytes = _layout(qtype_gate, row_length)
    up_unit, up_row_bytes = _layout(qtype_up, row_length)
    _check_x(cp, x, row_length, gate_unit)
    _check_x(cp, x, row_length, up_unit)
    pairs = _check_pairs(cp, rows, gate_ptrs)
    assert _check_pairs(cp, rows, up_ptrs) == pairs
    out = _output(cp, out, (pairs, n_ff))
    if pairs and n_ff:
        gate_layout, up_layout = layout_of(qtype_gate, row_length), layout_of(qtype_up, row_length)
        shape = _block_shape(gate_layout, up_layout)
        _gate_up_kernel(gate_unit, gate_layout, up_unit, up_layout, shape, GATE_UP_ONE_PASS, GATE_UP_MIN_BLOCKS)(
            (-(-n_ff // _tile(shape)), pairs), (shape[0],),
            (gate_ptrs, up_ptrs, rows, np.int64(gate_row_bytes), np.int64(up_row_bytes), np.int32(n_ff),
             np.int32(row_length), x, out, *_pass_args(cp, passes, pairs)),
        )
    return out


def module_defines(qtype: QT | int, row_length: int, layout: str | None = None) -> tuple[str, ...]:
    """The -D defines of the cuda/gemv.cu module that gemv and expert_gemv use for rows of `qtype`
    (in `layout`, by default layout_of's for that row length)."""
    qtype = _qtype(qtype)
    layout = layout or layout_of(qtype, row_length)
    return _defines(_layout(qtype, row_length)[0], layout) + _shape_defines(_block_shape(layout))


def gate_up_defines(qtype_gate: QT | int, qtype_up: QT | int, row_length: int) -> tuple[str, ...]:
    """The -D defines of the module holding expert_gate_up for this pair of types."""
    gate, up = _qtype(qtype_gate), _qtype(qtype_up)
    gate_layout, up_layout = layout_of(gate, row_length), layout_of(up, row_length)
    return _gate_up_module_defines(_layout(gate, row_length)[0], gate_layout, _layout(up, row_length)[0], up_layout,
                                   _block_shape(gate_layout, up_layout), GATE_UP_ONE_PASS, GATE_UP_MIN_BLOCKS)


def _cupy():
    try:
        import cupy
    except ImportError as e:
        raise CudaUnavailable(f"the CUDA GEMV needs CuPy: {e}") from e
    return cupy


def _qtype(qtype: QT | int) -> QT:
    qtype = QT(qtype)
    if qtype not in SUPPORTED_QTYPES:
        names = ", ".join(sorted(t.name for t in SUPPORTED_QTYPES))
        raise ValueError(f"no CUDA GEMV for {qtype.name}; supported: {names}")
    return qtype


def _layout(qtype: QT, row_length: int) -> tuple[str, int]:
    """(unit name, bytes per row) for rows of `row_length` values."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    assert row_length > 0 and row_length % block == 0, (
        f"row length {row_length} is not a positive multiple of {qtype.name}'s block size {block}"
    )
    unit = _SCALAR_UNITS[qtype] if qtype in _SCALAR_UNITS and row_length % 8 else _UNITS[qtype]
    return unit, row_length // block * type_size


def _alignment(qtype: QT, unit: str) -> int:
    """Byte alignment the unit's loads need of a matrix: what a block start has in a 16-byte aligned tensor."""
    type_size = GGML_QUANT_SIZES[qtype][1]
    if qtype in _SCALAR_UNITS:  # float rows: 16-byte loads, or one value at a time
        return type_size if unit == _SCALAR_UNITS[qtype] else 16
    return min(16, type_size & -type_size)


def _check_x(cp, x, row_length: int, unit: str) -> None:
    assert isinstance(x, cp.ndarray), f"x must be a cupy array, got {type(x).__name__}"
    assert x.dtype == cp.float32, f"x must be float32, got {x.dtype}"
    assert x.ndim == 2 and x.flags.c_contiguous, f"x must be 2-D and C-contiguous, got shape {x.shape}"
    assert x.shape[1] == row_length, f"x has {x.shape[1]} columns, the weight rows {row_length} values"
    if unit not in _SCALAR_UNITS.values():  # 16-byte loads of x
        assert x.data.ptr % 16 == 0, "x must be 16-byte aligned"


def _check_matrix(cp, w, qtype: QT, row_length: int, row_bytes: int) -> None:
    assert isinstance(w, cp.ndarray), f"w must be a cupy array, got {type(w).__name__}"
    assert w.dtype == cp.uint8 and w.ndim == 2, f"w must be 2-D uint8, got {w.ndim}-D {w.dtype}"
    assert w.flags.c_contiguous, "w must be C-contiguous"
    assert w.shape[1] == row_bytes, f"{qtype.name} rows of {row_length} values take {row_bytes} bytes, w has {w.shape[1]}"
    align = _alignment(qtype, _layout(qtype, row_length)[0])
    assert w.data.ptr % align == 0, f"{qtype.name} weights must be {align}-byte aligned"


def _check_pairs(cp, rows, w_ptrs) -> int:
    assert isinstance(rows, cp.ndarray) and rows.dtype == cp.int32, "rows must be a cupy int32 array"
    assert isinstance(w_ptrs, cp.ndarray) and w_ptrs.dtype == cp.uint64, "weight pointers must be a cupy uint64 array"
    assert rows.ndim == 1 and rows.flags.c_contiguous and w_ptrs.flags.c_contiguous, "rows and pointers must be 1-D contiguous"
    assert w_ptrs.shape == rows.shape, f"{rows.shape[0]} rows but {w_ptrs.shape} weight pointers"
    assert rows.shape[0] <= _MAX_PAIRS, f"at most {_MAX_PAIRS} pairs per launch, got {rows.shape[0]}"
    return rows.shape[0]


def _pass_args(cp, passes, pairs: int) -> tuple:
    """The kernels' (pass_of, pass): a null pointer for every pair, or the caller's int32 [>= P] flags and value."""
    if passes is None:
        return np.uint64(0), np.int32(0)
    pass_of, value = passes
    assert isinstance(pass_of, cp.ndarray) and pass_of.dtype == cp.int32 and pass_of.ndim == 1, (
        "pass_of must be a cupy int32 vector")
    assert pass_of.size >= pairs and pass_of.flags.c_contiguous, f"pass_of has {pass_of.size} flags for {pairs} pairs"
    return pass_of, np.int32(value)


def _check_norm(cp, norm_w, k: int) -> None:
    assert isinstance(norm_w, cp.ndarray) and norm_w.dtype == cp.float32 and norm_w.shape == (k,), (
        f"the norm's weight must be a cupy float32 [{k}]")
    assert norm_w.flags.c_contiguous, "the norm's weight must be contiguous"


def _output(cp, out, shape: tuple[int, int]):
    if out is None:
        return cp.empty(shape, dtype=cp.float32)
    assert isinstance(out, cp.ndarray) and out.dtype == cp.float32, "out must be a cupy float32 array"
    assert out.shape == shape and out.flags.c_contiguous, f"out must be C-contiguous {shape}, got {out.shape}"
    return out


def _block_shape(*layouts: str) -> tuple[int, int]:
    """A launch's (threads a CTA, columns a warp): (COLUMNS_THREADS, 2 COLUMNS_PER_THREAD) if any of its matrices
    takes the columns layout (a units-layout matrix beside them takes that many a warp too), else (32 UNITS_WARPS,
    UNITS_WARP_COLUMNS)."""
    assert UNITS_WARP_COLUMNS in (1, 2), f"UNITS_WARP_COLUMNS must be 1 or 2, got {UNITS_WARP_COLUMNS}"
    assert COLUMNS_THREADS in (64, 128, 256, 512), f"COLUMNS_THREADS must be 64, 128, 256 or 512, got {COLUMNS_THREADS}"
    assert COLUMNS_PER_THREAD in (1, 2), f"COLUMNS_PER_THREAD must be 1 or 2, got {COLUMNS_PER_THREAD}"
    return (COLUMNS_THREADS, 2 * COLUMNS_PER_THREAD) if "columns" in layouts else (32 * UNITS_WARPS, UNITS_WARP_COLUMNS)


def _tile(shape: tuple[int, int], tile_warps: int | None = None) -> int:
    """Columns a CTA computes (GEMV_TILE): its warps' (or `tile_warps` of them, GEMV_TILE_WARPS) columns."""
    threads, warp_columns = shape
    return (tile_warps or threads // 32) * warp_columns


def _shape_defines(shape: tuple[int, int]) -> tuple[str, ...]:
    threads, warp_columns = shape
    return ((() if threads == _THREADS else (f"GEMV_THREADS={threads}",))
            + (() if warp_columns == 2 else (f"GEMV_WARP_COLUMNS={warp_columns}",)))


def _defines(unit: str, layout: str) -> tuple[str, ...]:
    assert layout in ("columns", "units"), f"layout must be 'columns' or 'units', got {layout!r}"
    return (f"GEMV_UNIT={unit}", f"GEMV_COLUMNS={int(layout == 'columns')}")


@lru_cache(maxsize=None)
def _module_kernel(unit: str, layout: str, name: str, shape: tuple[int, int]):
    return load_module("gemv", _defines(unit, layout) + _shape_defines(shape)).get_function(name)


def multi_defines(units: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """The -D defines of the gemv_multi module for three (unit, layout) pairs: MULTI_UNIT0=..., MULTI_COLUMNS0=...;
    a fourth entry ("norm", "") asks for the normed module (MULTI_NORM)."""
    norm = units[3:] == (("norm", ""),)
    return tuple(f"MULTI_{name.removeprefix('GEMV_')}{i}={value}" for i, (unit, layout) in enumerate(units[:3])
                 for name, _, value in (d.partition("=") for d in _defines(unit, layout))) + (("MULTI_NORM=1",) if norm else ())


@lru_cache(maxsize=None)
def _multi_kernel(units: tuple[tuple[str, str], ...], name: str, shape: tuple[int, int]):
    return load_module("gemv", multi_defines(units) + _shape_defines(shape)).get_function(name)


def _route_module_defines(unit: str, layout: str, shape: tuple[int, int], ahead: int,
                          tile_warps: int | None = None) -> tuple[str, ...]:
    return (_defines(unit, layout) + ("GEMV_ROUTE=1",) + _shape_defines(shape)
            + ((f"GEMV_LOAD_AHEAD={ahead}",) if ahead != 1 else ())
            + ((f"GEMV_TILE_WARPS={tile_warps}",) if tile_warps is not None else ()))


@lru_cache(maxsize=None)
def _route_kernel(unit: str, layout: str, name: str, shape: tuple[int, int], ahead: int, tile_warps: int | None):
    return load_module("gemv", _route_module_defines(unit, layout, shape, ahead, tile_warps)).get_function(name)


@lru_cache(maxsize=None)
def _max_shared() -> int:
    """The shared memory a block of this device may opt in to (227 KB on an H100)."""
    cp = _cupy()
    got = cp.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin")
    # 97: cudaDevAttrMaxSharedMemoryPerBlockOptin, for a CuPy whose attribute table lacks it
    return int(got if got is not None else cp.cuda.runtime.deviceGetAttribute(97, cp.cuda.Device().id))


def _normed_kernel(kernel, floats: int):
    """`kernel` allowed the dynamic shared memory of `floats` normed values (it opts in past 48 KB in all)."""
    needed = floats * 4 + _STATIC_SHARED // 2  # the tile and the ranking's scratch take under 24 KB
    if needed > _STATIC_SHARED and kernel.max_dynamic_shared_size_bytes < floats * 4:
        kernel.max_dynamic_shared_size_bytes = floats * 4
    return kernel


def _gate_up_defines(gate_unit: str, gate_layout: str, up_unit: str, up_layout: str) -> tuple[str, ...]:
    if (gate_unit, gate_layout) == (up_unit, up_layout):
        return _defines(gate_unit, gate_layout)
    gate, up = _defines(gate_unit, gate_layout), _defines(up_unit, up_layout)
    return (*(d.replace("GEMV_", "GATE_") for d in gate), *(d.replace("GEMV_", "UP_") for d in up))


def _passes_defines(one_pass: bool) -> tuple[str, ...]:
    return () if one_pass else ("GATE_UP_TWO_PASSES=1",)


def _bounds_defines(min_blocks: int | None) -> tuple[str, ...]:
    assert min_blocks is None or 1 <= min_blocks <= 16, f"GATE_UP_MIN_BLOCKS must be None or 1 to 16, got {min_blocks}"
    return () if min_blocks is None else (f"GATE_UP_MIN_BLOCKS={min_blocks}",)


def _gate_up_module_defines(gate_unit: str, gate_layout: str, up_unit: str, up_layout: str, shape: tuple[int, int],
                            one_pass: bool, min_blocks: int | None) -> tuple[str, ...]:
    return (_gate_up_defines(gate_unit, gate_layout, up_unit, up_layout) + _shape_defines(shape)
            + _passes_defines(one_pass) + _bounds_defines(min_blocks))


@lru_cache(maxsize=None)
def _gate_up_kernel(gate_unit: str, gate_layout: str, up_unit: str, up_layout: str, shape: tuple[int, int],
                    one_pass: bool, min_blocks: int | None):
    return load_module("gemv", _gate_up_module_defines(gate_unit, gate_layout, up_unit, up_layout, shape, one_pass,
                                                       min_blocks)).get_function("expert_gate_up")
