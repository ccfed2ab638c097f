"""The GEMV launches' block shapes (runner/backends/cuda/gemv.py), on the CPU: the columns layout takes
COLUMNS_THREADS threads (128 by default), 16 a column, whatever UNITS_WARPS says; a launch whose matrices all take
the units layout gets
32 UNITS_WARPS threads and UNITS_WARP_COLUMNS columns a warp, and the module is compiled for that shape (its
defines), so a grid of N / tile blocks covers every column once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.cuda import gemv as gemv_cuda


@pytest.fixture
def shape(monkeypatch: pytest.MonkeyPatch):
    def set_shape(warps: int, warp_columns: int) -> None:
        monkeypatch.setattr(gemv_cuda, "UNITS_WARPS", warps)
        monkeypatch.setattr(gemv_cuda, "UNITS_WARP_COLUMNS", warp_columns)
    return set_shape


def test_the_columns_layout_keeps_its_threads_and_16_a_column(shape) -> None:
    shape(4, 1)
    block = gemv_cuda._block_shape("columns")
    assert block == (128, 2) and gemv_cuda._tile(block) == 8  # the default: 8 columns a CTA
    assert gemv_cuda.module_defines(QT.Q4_K, 2048, "columns") == ("GEMV_UNIT=UnitQ4_K", "GEMV_COLUMNS=1",
                                                                   "GEMV_THREADS=128")
    assert gemv_cuda._block_shape("units", "columns") == (128, 2)  # a mixed launch: the columns layout's tile


@pytest.mark.parametrize("warps,warp_columns,tile", [(16, 2, 32), (4, 2, 8), (4, 1, 4), (1, 1, 1)])
def test_units_launches_take_the_configured_shape_and_compile_for_it(shape, warps: int, warp_columns: int,
                                                                     tile: int) -> None:
    shape(warps, warp_columns)
    block = gemv_cuda._block_shape("units")
    assert block == (32 * warps, warp_columns) and gemv_cuda._tile(block) == tile
    extra = {f"GEMV_THREADS={32 * warps}"} if warps != 16 else set()
    extra |= {f"GEMV_WARP_COLUMNS={warp_columns}"} if warp_columns != 2 else set()
    defines = gemv_cuda.module_defines(QT.Q4_K, 2048, "units")
    assert defines[:2] == ("GEMV_UNIT=UnitQ4_K", "GEMV_COLUMNS=0") and set(defines[2:]) == extra


def test_a_warp_owns_one_or_two_columns(shape) -> None:
    shape(4, 3)
    with pytest.raises(AssertionError, match="UNITS_WARP_COLUMNS"):
        gemv_cuda._block_shape("units")


def test_the_layout_follows_the_row_length_from_units_from_row(monkeypatch: pytest.MonkeyPatch, shape) -> None:
    """UNITS_FROM_ROW None: LAYOUTS alone. Set: rows at least that long take the units layout (and its block
    shape, in every launch and module), shorter ones keep their type's."""
    assert gemv_cuda.UNITS_FROM_ROW is None
    assert all(gemv_cuda.layout_of(qtype, 4096) == layout for qtype, layout in gemv_cuda.LAYOUTS.items())
    shape(4, 2)
    monkeypatch.setattr(gemv_cuda, "UNITS_FROM_ROW", 2048)
    assert gemv_cuda.LAYOUTS[QT.Q4_K] == "columns"
    assert gemv_cuda.layout_of(QT.Q4_K, 2048) == gemv_cuda.layout_of(QT.Q4_K, 4096) == "units"
    assert gemv_cuda.layout_of(QT.Q4_K, 512) == "columns" and gemv_cuda.layout_of(QT.F32, 512) == "units"
    assert gemv_cuda.module_defines(QT.Q4_K, 2048) == ("GEMV_UNIT=UnitQ4_K", "GEMV_COLUMNS=0", "GEMV_THREADS=128")
    assert gemv_cuda.module_defines(QT.Q4_K, 512) == ("GEMV_UNIT=UnitQ4_K", "GEMV_COLUMNS=1", "GEMV_THREADS=128")
    assert gemv_cuda.gate_up_defines(QT.Q4_K, QT.Q6_K, 2048) == (
        "GATE_UNIT=UnitQ4_K", "GATE_COLUMNS=0", "UP_UNIT=UnitQ6_K", "UP_COLUMNS=0", "GEMV_THREADS=128")
    assert gemv_cuda.gate_up_defines(QT.Q4_K, QT.F32, 512) == (
        "GATE_UNIT=UnitQ4_K", "GATE_COLUMNS=1", "UP_UNIT=UnitF32", "UP_COLUMNS=0", "GEMV_THREADS=128")  # mixed: the columns shape


@pytest.mark.parametrize("threads,tile", [(512, 32), (256, 16), (128, 8), (64, 4)])
def test_columns_threads_sets_the_columns_launches_and_mixed_ones(monkeypatch: pytest.MonkeyPatch, shape,
                                                                  threads: int, tile: int) -> None:
    """COLUMNS_THREADS: every launch with a columns-layout matrix takes that many threads, 16 a column (mixed
    launches too, their units matrices 2 columns a warp); units-only launches keep UNITS_WARPS."""
    shape(4, 1)
    monkeypatch.setattr(gemv_cuda, "COLUMNS_THREADS", threads)
    for layouts in (("columns",), ("units", "columns")):
        block = gemv_cuda._block_shape(*layouts)
        assert block == (threads, 2) and gemv_cuda._tile(block) == tile
    assert gemv_cuda._block_shape("units") == (128, 1)
    extra = () if threads == 512 else (f"GEMV_THREADS={threads}",)
    assert gemv_cuda.module_defines(QT.Q4_K, 2048, "columns") == ("GEMV_UNIT=UnitQ4_K", "GEMV_COLUMNS=1", *extra)


def test_columns_threads_are_a_power_of_two_from_64_to_512(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemv_cuda, "COLUMNS_THREADS", 96)
    with pytest.raises(AssertionError, match="COLUMNS_THREADS"):
        gemv_cuda._block_shape("columns")


def test_gate_up_in_two_passes_is_its_own_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """GATE_UP_ONE_PASS off compiles expert_gate_up with GATE_UP_TWO_PASSES (the A/B arm); on, the default module."""
    assert gemv_cuda.GATE_UP_ONE_PASS
    assert gemv_cuda.gate_up_defines(QT.Q4_K, QT.Q4_K, 2048) == ("GEMV_UNIT=UnitQ4_K", "GEMV_COLUMNS=1",
                                                                  "GEMV_THREADS=128")
    monkeypatch.setattr(gemv_cuda, "GATE_UP_ONE_PASS", False)
    assert gemv_cuda.gate_up_defines(QT.Q4_K, QT.Q4_K, 2048) == (
        "GEMV_UNIT=UnitQ4_K", "GEMV_COLUMNS=1", "GEMV_THREADS=128", "GATE_UP_TWO_PASSES=1")


@pytest.mark.parametrize("threads,per_thread,tile", [(512, 1, 32), (512, 2, 64), (128, 2, 16), (64, 2, 8)])
def test_two_columns_a_thread_double_the_columns_layout_tile(monkeypatch: pytest.MonkeyPatch, threads: int,
                                                             per_thread: int, tile: int) -> None:
    """COLUMNS_PER_THREAD 2: 4 columns a warp (2 a thread, 16 threads a column still), so a grid of N / tile
    blocks, half as many, and the module's GEMV_WARP_COLUMNS define say so; units-only launches keep their shape."""
    monkeypatch.setattr(gemv_cuda, "COLUMNS_THREADS", threads)
    monkeypatch.setattr(gemv_cuda, "COLUMNS_PER_THREAD", per_thread)
    block = gemv_cuda._block_shape("columns")
    assert block == (threads, 2 * per_thread) and gemv_cuda._tile(block) == tile
    assert gemv_cuda._block_shape("units", "columns") == block and gemv_cuda._block_shape("units") == (512, 2)
    defines = set(gemv_cuda.module_defines(QT.Q4_K, 2048, "columns")[2:])
    assert defines == ({f"GEMV_THREADS={threads}"} if threads != 512 else set()) | (
        {"GEMV_WARP_COLUMNS=4"} if per_thread == 2 else set())
    monkeypatch.setattr(gemv_cuda, "COLUMNS_PER_THREAD", 3)
    with pytest.raises(AssertionError, match="COLUMNS_PER_THREAD"):
        gemv_cuda._block_shape("columns")


@pytest.mark.parametrize("warp_columns,ahead", [(2, 1), (1, 1), (1, 8), (2, 4)])
def test_the_routers_launch_takes_its_own_warp_columns_and_loads_ahead(monkeypatch: pytest.MonkeyPatch,
                                                                       warp_columns: int, ahead: int) -> None:
    """ROUTE_WARP_COLUMNS and ROUTE_LOAD_AHEAD shape only the normed router's launch of a units-layout (float)
    router: its 512 threads stay (a thread an expert for the ranking), its tile is 16 warps' columns, its module
    says both; a columns-layout router and every other launch keep their shapes."""
    monkeypatch.setattr(gemv_cuda, "ROUTE_WARP_COLUMNS", warp_columns)
    monkeypatch.setattr(gemv_cuda, "ROUTE_LOAD_AHEAD", ahead)
    shape = gemv_cuda._route_shape("units")
    assert shape == (512, warp_columns) and gemv_cuda._tile(shape) == 16 * warp_columns
    extra = ({"GEMV_WARP_COLUMNS=1"} if warp_columns == 1 else set()) | (
        {f"GEMV_LOAD_AHEAD={ahead}"} if ahead != 1 else set())
    defines = gemv_cuda.route_defines(QT.F32, 2048)
    assert defines[:3] == ("GEMV_UNIT=UnitF32", "GEMV_COLUMNS=0", "GEMV_ROUTE=1") and set(defines[3:]) == extra
    assert gemv_cuda._block_shape("units") == (512, 2) and gemv_cuda.module_defines(QT.F32, 2048) == (
        "GEMV_UNIT=UnitF32", "GEMV_COLUMNS=0")
    assert gemv_cuda._route_shape("columns") == gemv_cuda._block_shape("columns")  # a quantized router
    monkeypatch.setattr(gemv_cuda, "UNITS_WARPS", 4)  # the other units launches' warps: not the router's
    assert gemv_cuda._route_shape("units") == (512, warp_columns) and gemv_cuda._block_shape("units")[0] == 128
    assert gemv_cuda.route_defines(QT.Q8_0, 512) == ("GEMV_UNIT=UnitQ8_0", "GEMV_COLUMNS=1", "GEMV_ROUTE=1",
                                                     "GEMV_THREADS=128")


def test_the_routers_tile_warps_are_its_own_define(monkeypatch: pytest.MonkeyPatch) -> None:
    """ROUTE_TILE_WARPS gives a units-layout router's module GEMV_TILE_WARPS (its CTAs keep 512 threads for the
    ranking); None, or a quantized router in the columns layout, keeps the module as it was."""
    plain = gemv_cuda.route_defines(QT.F32, 2048)
    quantized = gemv_cuda.route_defines(QT.Q8_0, 512)
    monkeypatch.setattr(gemv_cuda, "ROUTE_TILE_WARPS", 4)
    assert gemv_cuda.route_defines(QT.F32, 2048) == (*plain, "GEMV_TILE_WARPS=4")
    assert gemv_cuda._route_shape("units")[0] == 512
    assert gemv_cuda.route_defines(QT.Q8_0, 512) == quantized


@pytest.mark.parametrize("name,value", [("ROUTE_WARP_COLUMNS", 4), ("ROUTE_LOAD_AHEAD", 0), ("ROUTE_LOAD_AHEAD", 9),
                                        ("ROUTE_TILE_WARPS", 3), ("ROUTE_TILE_WARPS", 32)])
def test_the_routers_shape_is_checked(monkeypatch: pytest.MonkeyPatch, name: str, value: int) -> None:
    monkeypatch.setattr(gemv_cuda, name, value)
    with pytest.raises(AssertionError, match=name):
        gemv_cuda.route_defines(QT.F32, 2048)


def test_gate_ups_minimum_blocks_are_their_own_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """GATE_UP_MIN_BLOCKS bounds expert_gate_up's registers through its module's define; None keeps the module
    gemv_r and expert_gemv share."""
    assert gemv_cuda.GATE_UP_MIN_BLOCKS is None
    shared = gemv_cuda.gate_up_defines(QT.Q4_K, QT.Q4_K, 2048)
    assert shared == gemv_cuda.module_defines(QT.Q4_K, 2048)
    monkeypatch.setattr(gemv_cuda, "GATE_UP_MIN_BLOCKS", 6)
    assert gemv_cuda.gate_up_defines(QT.Q4_K, QT.Q4_K, 2048) == (*shared, "GATE_UP_MIN_BLOCKS=6")
    monkeypatch.setattr(gemv_cuda, "GATE_UP_MIN_BLOCKS", 0)
    with pytest.raises(AssertionError, match="GATE_UP_MIN_BLOCKS"):
        gemv_cuda.gate_up_defines(QT.Q4_K, QT.Q4_K, 2048)


def test_unit_values_are_the_kernels() -> None:
    """UNIT_VALUES (the values a unit reads, which half_slices counts) against cuda/gemv.cu's Unit::UNIT."""
    source = (Path(__file__).resolve().parent.parent / "cuda" / "gemv.cu").read_text()
    units = dict(re.findall(r"struct (\w+) \{[^\n]*\n\s+static constexpr int UNIT = (\d+)", source))
    aliases = dict((alias, base) for base, alias in re.findall(r"typedef (\w+)<[^>]*> (\w+);", source))
    for qtype, name in gemv_cuda._UNITS.items():
        assert int(units[aliases.get(name, name)]) == gemv_cuda.UNIT_VALUES[qtype], qtype.name


@pytest.mark.parametrize("qtype,k,half", [(QT.Q4_K, 512, True), (QT.Q6_K, 512, True), (QT.Q4_K, 768, False),
                                          (QT.Q8_0, 256, True), (QT.Q8_0, 512, False), (QT.Q2_K, 1024, True),
                                          (QT.F16, 64, False)])
def test_half_slices_take_rows_of_at_most_8_units(monkeypatch: pytest.MonkeyPatch, qtype: QT, k: int,
                                                  half: bool) -> None:
    """EXPERT_HALF_SLICES: expert_gemv_half for columns-layout rows of at most 8 units, one column a thread."""
    assert not gemv_cuda.half_slices(QT.Q4_K, 512)  # off by default
    monkeypatch.setattr(gemv_cuda, "EXPERT_HALF_SLICES", True)
    assert gemv_cuda.half_slices(qtype, k) == half
    monkeypatch.setattr(gemv_cuda, "COLUMNS_PER_THREAD", 2)
    assert not gemv_cuda.half_slices(qtype, k)
