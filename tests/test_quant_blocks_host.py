"""cuda/blocks.cuh's block decoders, compiled as host code, against gguf.quants.dequantize, bit for bit.

The kernels (dequant.cu, gemv.cu) decode every quant type with these functions; here a small harness
(tests/quant_blocks_host.cpp) runs them on the CPU, built by g++ as plain C++ and by nvcc as CUDA
(its host pass, which also compiles the header's device side), whichever is installed. The blocks are
random bytes: every index, sign and scale field, and fp16 scales of every bit pattern (NaN compares
equal to NaN). Also checks that cuda/quant_tables.cuh is what scripts/gen_quant_tables.py makes of
the installed gguf package.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize

HARNESS = Path(__file__).with_name("quant_blocks_host.cpp")
CUDA_DIR = Path(__file__).resolve().parent.parent / "cuda"
# Every type with a Block* decoder in blocks.cuh (F16/BF16/F32 have no blocks).
QTYPES = [
    QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_NL,
    QT.IQ4_XS, QT.MXFP4, QT.IQ1_S, QT.IQ1_M, QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ3_XXS, QT.IQ3_S,
    QT.TQ1_0, QT.TQ2_0,
]
BLOCKS_PER_TYPE = 2048


def _nvcc() -> str | None:
    return shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if Path(p).is_file()), None)


# (id, compiler lookup, command given the compiler, the kernel dir and the output path)
COMPILERS = {
    "g++": (lambda: shutil.which("g++"),
            lambda cc, inc, out: [cc, "-std=c++17", "-O2", "-ffp-contract=off", f"-I{inc}", "-x", "c++", str(HARNESS),
                                  "-o", str(out)]),
    "nvcc": (_nvcc,
             lambda cc, inc, out: [cc, "-std=c++17", "-O2", "-Xcompiler", "-ffp-contract=off", f"-I{inc}", "-x", "cu",
                                   str(HARNESS), "-o", str(out)]),
}


@pytest.fixture(scope="module", params=list(COMPILERS))
def harness(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    find, command = COMPILERS[request.param]
    compiler = find()
    if compiler is None:
        pytest.skip(f"no {request.param} to build the host harness with")
    out = tmp_path_factory.mktemp("quant_blocks") / "quant_blocks_host"
    built = subprocess.run(command(compiler, CUDA_DIR, out), check=False, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, f"{request.param} failed to build {HARNESS.name}:\n{built.stderr}"
    return out


def decode_on_host(harness: Path, qtype: QT, raw: np.ndarray) -> np.ndarray:
    done = subprocess.run([str(harness), qtype.name], check=False, input=raw.tobytes(), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    return np.frombuffer(done.stdout, dtype=np.float32)


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_host_decoder_matches_gguf_bit_for_bit(harness: Path, qtype: QT) -> None:
    block, type_size = GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(int(qtype)).integers(0, 256, (BLOCKS_PER_TYPE, type_size), dtype=np.uint8)
    got = decode_on_host(harness, qtype, raw)
    with np.errstate(all="ignore"):  # random fp16 scales include NaN and inf
        want = dequantize(raw, qtype).astype(np.float32).reshape(-1)
    assert got.shape == want.shape
    differ = (got.view(np.uint32) != want.view(np.uint32)) & ~(np.isnan(got) & np.isnan(want))
    assert not differ.any(), (
        f"{differ.sum()} of {differ.size} values differ, first at value {np.argmax(differ)} of "
        f"block {np.argmax(differ) // block}: {got[differ][0]!r} against gguf's {want[differ][0]!r}"
    )
    assert np.isfinite(want).mean() > 0.9  # the comparison is mostly of numbers, not NaN against NaN


def test_unknown_type_is_refused(harness: Path) -> None:
    done = subprocess.run([str(harness), "Q9_9"], check=False, input=b"", capture_output=True, timeout=60)
    assert done.returncode == 2 and b"unknown type" in done.stderr


def test_grid_header_is_generated_from_the_gguf_package() -> None:
    from scripts.gen_quant_tables import header_text

    assert (CUDA_DIR / "quant_tables.cuh").read_text() == header_text(), (
        "cuda/quant_tables.cuh is stale: rerun python -m scripts.gen_quant_tables"
    )


@pytest.mark.parametrize(("source", "defines"),
                         [("dequant.cu", ()), ("gemv.cu", ("GEMV_UNIT=UnitIQ3_S", "GEMV_COLUMNS=0"))],
                         ids=["dequant", "gemv-UnitIQ3_S"])
def test_device_code_compiles_with_every_helper_inlined(source: str, defines: tuple[str, ...], tmp_path: Path) -> None:
    """The device side of the same header, which the host harness does not run: it compiles for sm_90,
    uses the non-fusing mul.rn (mul_rn calling itself instead of __fmul_rn compiled to no multiply at
    all, the recursion deleted as undefined behaviour), and has no calls (every helper is forceinline)."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("no nvcc to compile the device code with")
    ptx = tmp_path / "out.ptx"
    built = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-ptx", f"-I{CUDA_DIR}", *(f"-D{d}" for d in defines),
                            str(CUDA_DIR / source), "-o", str(ptx)], check=False, capture_output=True, text=True,
                           timeout=600)
    assert built.returncode == 0, built.stderr
    text = ptx.read_text()
    assert "mul.rn.f32" in text
    calls = [line.strip() for line in text.splitlines() if line.strip().startswith("call")]
    assert not calls, f"{len(calls)} calls in the PTX, first: {calls[0]}"
