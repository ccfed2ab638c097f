"""The decode products' modules (cuda/gemv.cu) as gemv.py's launch shapes compile them, without a GPU: where nvcc
is installed, each shape the knobs allow builds for sm_90, and the router's entries do not spill. A module's
static checks once tripped on a shape no CPU test compiled (a units-layout module of one column a warp)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.cuda import gemv as gemv_cuda
from test_flash_attention_build import _nvcc

SOURCE = Path(__file__).resolve().parent.parent / "cuda" / "gemv.cu"


def _build(defines: tuple[str, ...], out: Path) -> str:
    """ptxas's report of the module built with `defines`; skips without nvcc, fails on a compile error."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("no nvcc to compile the device code with")
    built = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", f"-I{SOURCE.parent}",
                            *(f"-D{d}" for d in defines), str(SOURCE), "-o", str(out)],
                           check=False, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    return built.stderr


@pytest.mark.parametrize("warp_columns,ahead,tile_warps", [(2, 1, None), (1, 1, None), (1, 8, None), (2, 4, None),
                                                        (1, 8, 4)])
def test_the_routers_module_builds_without_spills(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  warp_columns: int, ahead: int, tile_warps: int | None) -> None:
    monkeypatch.setattr(gemv_cuda, "ROUTE_WARP_COLUMNS", warp_columns)
    monkeypatch.setattr(gemv_cuda, "ROUTE_LOAD_AHEAD", ahead)
    monkeypatch.setattr(gemv_cuda, "ROUTE_TILE_WARPS", tile_warps)
    report = _build(gemv_cuda.route_defines(QT.F32, 2048), tmp_path / "route.cubin")
    # the ranking's recursive pairwise helpers (route.cuh) keep a stack of their own at any shape
    spills = dict(re.findall(r"Function properties for (gemv_\w+)\n.*?(\d+) bytes spill stores", report))
    assert set(spills) == {f"gemv_norm_route_r{r}" for r in (1, 2, 3, 4)}, report
    assert not any(int(stored) for stored in spills.values()), report


@pytest.mark.parametrize("warps,warp_columns", [(16, 2), (4, 2), (4, 1)])
def test_a_units_module_builds_at_every_warp_shape(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, warps: int,
                                                   warp_columns: int) -> None:
    monkeypatch.setattr(gemv_cuda, "UNITS_WARPS", warps)
    monkeypatch.setattr(gemv_cuda, "UNITS_WARP_COLUMNS", warp_columns)
    _build(gemv_cuda.module_defines(QT.Q4_K, 2048, "units"), tmp_path / "units.cubin")


@pytest.mark.parametrize("threads,per_thread", [(128, 1), (512, 1), (128, 2)])
def test_a_columns_module_builds_at_every_thread_count(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                       threads: int, per_thread: int) -> None:
    monkeypatch.setattr(gemv_cuda, "COLUMNS_THREADS", threads)
    monkeypatch.setattr(gemv_cuda, "COLUMNS_PER_THREAD", per_thread)
    report = _build(gemv_cuda.module_defines(QT.Q4_K, 2048, "columns"), tmp_path / "columns.cubin")
    # expert_gemv_half only where a thread takes one column (half_slices launches it only there)
    assert ("entry function 'expert_gemv_half'" in report) == (per_thread == 1), report


@pytest.mark.parametrize("min_blocks", [6, 7])
def test_gate_ups_minimum_blocks_cap_its_registers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   min_blocks: int) -> None:
    """GATE_UP_MIN_BLOCKS at 128 threads: at most 65536 / (128 blocks) registers, so that many CTAs fit an SM.
    (Unbounded, the one-pass Q4_K entry took 96 with CUDA 13's ptxas, 5 an SM, until 2026-12-08's branch-free
    scale decode brought it to 80.)"""
    monkeypatch.setattr(gemv_cuda, "GATE_UP_MIN_BLOCKS", min_blocks)
    report = _build(gemv_cuda.gate_up_defines(QT.Q4_K, QT.Q4_K, 2048), tmp_path / "gate_up.cubin")
    used = re.search(r"entry function 'expert_gate_up'.*?Used (\d+) registers", report, re.DOTALL)
    assert used is not None, report
    assert int(used.group(1)) <= 65536 // (128 * min_blocks), report
