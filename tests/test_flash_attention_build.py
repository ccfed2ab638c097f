"""The prompt attention kernel (cuda/flash_attention.cu) as built, without a GPU: the wrapper's constants
are the .cu's defines, every variant's shared memory fits a consumer card's 99 KiB per block, and (where
nvcc is installed) each build compiles for sm_90 without spilling where it must not."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "cuda" / "flash_attention.cu"
WRAPPER = ROOT / "runner" / "backends" / "cuda" / "attention.py"
SHARED_LIMIT_BYTES = 99 * 1024


def _defines() -> dict[str, int]:
    return {name: int(value) for name, value in re.findall(r"^#define (\w+) (\d+)\b", SOURCE.read_text(), re.MULTILINE)}


def _wrapper_constants() -> dict[str, int]:
    """Module-level integer assignments (a = 1; a, b = 1, 2) of the wrapper."""
    found: dict[str, int] = {}
    for node in ast.parse(WRAPPER.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            values = value.elts if isinstance(value, ast.Tuple) else [value]
            for n, v in zip(names, values, strict=False):
                if isinstance(n, ast.Name) and isinstance(v, ast.Constant) and isinstance(v.value, int):
                    found[n.id] = v.value
    return found


def test_wrapper_constants_are_the_kernel_defines() -> None:
    cu, py = _defines(), _wrapper_constants()
    assert cu["FLASH_WARPS"] == 8 and py["FLASH_ROWS"] == 16 * cu["FLASH_WARPS"]
    assert py["FLASH_THREADS"] == 32 * cu["FLASH_WARPS"]
    assert py["FLASH_F16_KEYS"] == cu["FLASH_F16_KEYS"]
    kernels = re.findall(r"^FLASH_KERNEL\((\w+), (\w+), (\d+), (\w+), (\w+), (\w+)", SOURCE.read_text(), re.MULTILINE)
    keys = {(tag, int(cap)): (body, bk) for _, tag, cap, _, body, bk in kernels}
    assert keys == {
        ("f32", 64): ("flash_tiled", str(py["FLASH_F32_KEYS"])), ("f32", 128): ("flash_tiled", str(py["FLASH_F32_KEYS"])),
        ("f16", 64): ("flash_tiled", "FLASH_F16_KEYS"), ("f16", 128): ("flash_tiled", "FLASH_F16_KEYS"),
        ("f32", 256): ("flash_staged", str(py["FLASH_STAGED_KEYS"])),
        ("f16", 256): ("flash_staged", str(py["FLASH_STAGED_KEYS"])),
    }


@pytest.mark.parametrize("f16_keys", [64, 32])
def test_every_variant_fits_99_kib_of_shared_memory(f16_keys: int) -> None:
    py = _wrapper_constants()
    for cap in (64, 128):  # flash_tiled: 2 stages of a K and a V tile [BK][cap + 8] fp16
        for keys in (f16_keys, py["FLASH_F32_KEYS"]):
            assert 2 * 2 * keys * (cap + 8) * 2 <= SHARED_LIMIT_BYTES
    staged = (py["FLASH_ROWS"] + 2 * py["FLASH_STAGED_KEYS"]) * (256 + 8) * 2  # q beside one K and V tile
    assert staged <= SHARED_LIMIT_BYTES


def _nvcc() -> str | None:
    return shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if Path(p).is_file()), None)


@pytest.mark.parametrize("f16_keys", [64, 32])
def test_compiles_for_sm90_without_spills(f16_keys: int, tmp_path: Path) -> None:
    """Every kernel of the build compiles; none spills, but the two-blocks-per-SM float16 one at head dim 128,
    whose 128-register bound costs a few bytes."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("no nvcc to compile the device code with")
    built = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", f"-I{SOURCE.parent}",
                            f"-DFLASH_F16_KEYS={f16_keys}", str(SOURCE), "-o", str(tmp_path / "out.cubin")],
                           check=False, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    spills = dict(re.findall(r"Function properties for (\w+)\n.*?(\d+) bytes spill stores", built.stderr))
    assert len(spills) == 6, built.stderr
    allowed = {"flash_prefill_f16_d128"} if f16_keys == 32 else set()
    assert {name for name, stored in spills.items() if int(stored)} <= allowed, built.stderr
