"""The prompt GEMMs' tile constants (runner/backends/cuda/moe_prefill.py, gemm.py) are the .cu's defines, and
every tile's shared memory fits a consumer card's 99 KiB per block. Read from the sources: no GPU needed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _defines() -> dict[str, int]:
    text = (ROOT / "cuda" / "moe_prefill.cu").read_text()
    return {name: int(value) for name, value in re.findall(r"^#define (\w+) (\d+)\b", text, re.MULTILINE)}


def _constants(relpath: str) -> dict[str, int]:
    """Module-level integer assignments (a = 1; a, b = 1, 2) of a Python file."""
    found: dict[str, int] = {}
    for node in ast.parse((ROOT / relpath).read_text()).body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        names = target.elts if isinstance(target, ast.Tuple) else [target]
        values = value.elts if isinstance(value, ast.Tuple) else [value]
        for n, v in zip(names, values):
            if isinstance(n, ast.Name) and isinstance(v, ast.Constant) and isinstance(v.value, int):
                found[n.id] = v.value
    return found


def test_wrapper_tile_constants_are_the_kernel_defines() -> None:
    cu, mp, gemm = _defines(), _constants("runner/backends/cuda/moe_prefill.py"), _constants(
        "runner/backends/cuda/gemm.py")
    assert (mp["PAIR_TILE_ROWS"], mp["GATE_UP_TILE_COLS"], mp["DOWN_TILE_COLS"]) == (
        cu["PAIR_BM"], cu["GATE_UP_BN"], cu["DOWN_BN"])
    assert (mp["K_STEP"], mp["MP_STAGES"], mp["MP_LD"], mp["MP_THREADS"], mp["COMBINE_THREADS"]) == (
        cu["MP_BK"], cu["MP_STAGES"], cu["MP_LD"], cu["MP_THREADS"], cu["COMBINE_THREADS"])
    assert (gemm["ROW_TILE"], gemm["SMALL_ROW_TILE"], gemm["COL_TILE"]) == (
        cu["LINEAR_BM"], cu["LINEAR_SMALL_BM"], cu["LINEAR_BN"])
    assert cu["MP_THREADS"] == 32 * cu["MP_WARPS"] and cu["MP_PIECE_ROWS"] == cu["MP_THREADS"] // (cu["MP_BK"] // 8)


def test_every_tile_fits_99_kib_of_shared_memory() -> None:
    cu = _defines()
    stage_rows = [cu["PAIR_BM"] + 2 * cu["GATE_UP_BN"], cu["PAIR_BM"] + cu["DOWN_BN"],
                  cu["LINEAR_BM"] + cu["LINEAR_BN"], cu["LINEAR_SMALL_BM"] + cu["LINEAR_BN"]]
    for rows in stage_rows:
        assert cu["MP_STAGES"] * rows * cu["MP_LD"] * 2 <= 99 * 1024
