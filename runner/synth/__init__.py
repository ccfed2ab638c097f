"""`runner synth`: random-weight GGUF files of real architectures, for tests and benchmarks."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gguf import GGMLQuantizationType as QT

from runner.errors import SynthError
from runner.synth.mixes import MIX_NAMES, mix_qtype
from runner.synth.presets import PRESETS, SynthShape, resolve_shape
from runner.synth.writer import FLOAT_STORE, PlannedTensor, stored_nbytes, tensor_plan, write_synthetic

__all__ = ["PRESETS", "SynthResult", "planned_bytes", "synthesize", "tensor_plan"]


@dataclass(frozen=True)
class SynthResult:
    path: Path
    shape: SynthShape
    quant: str
    tensor_bytes: int


def synthesize(
    out: str | Path, arch: str, preset: str, quant: str = "F32", seed: int = 0,
    layers: int | None = None, experts: int | None = None, progress: Callable[[int], None] | None = None,
    direct: bool = False, jobs: int = 1,
) -> SynthResult:
    """Write a synthetic model to `out`: directly for float types and full-size presets, else via llama.cpp.

    `direct` writes a mix's types as random quant blocks (as full-size presets always do) instead of
    quantizing float weights with llama.cpp: no llama_cpp needed, but not llama.cpp's own rounding.
    `jobs` worker processes draw tensors ahead of the writer (the same file for any count).
    """
    out = Path(out)
    shape = resolve_shape(arch, preset, layers, experts)
    quant = quant.upper()
    if shape.full_size or direct:
        if quant not in MIX_NAMES:
            raise SynthError(f"full-size presets write quant blocks directly; choose from {', '.join(MIX_NAMES)}")
        n_all = shape.n_layer + shape.n_nextn
        written = write_synthetic(out, arch, shape, lambda t: mix_qtype(quant, t.name, n_all, shape=t.shape), seed, progress,
                                  random_blocks=True, jobs=jobs)
    elif quant in FLOAT_STORE:
        written = write_synthetic(out, arch, shape, lambda t: _float_store_type(t, FLOAT_STORE[quant]), seed, progress,
                                  jobs=jobs)
    elif quant in _llama_mixes():
        from runner.synth.quantize import llama_quantize

        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            f32 = Path(tmp) / "f32.gguf"
            write_synthetic(f32, arch, shape, lambda t: QT.F32, seed, progress)
            llama_quantize(f32, out, quant)
        written = out.stat().st_size
    else:
        known = sorted(set(FLOAT_STORE) | set(_llama_mixes()))
        raise SynthError(f"unknown quant type '{quant}'; choose from {', '.join(known)}")
    return SynthResult(out, shape, quant, written)


def _llama_mixes() -> tuple[str, ...]:
    from runner.synth.quantize import LLAMA_MIXES  # imports llama_cpp, which the GPU box lacks; only needed here

    return LLAMA_MIXES


def _float_store_type(t: PlannedTensor, qt: QT) -> QT:
    # Norms, biases, the router and DeltaNet's conv kernel stay F32, as llama.cpp keeps them.
    return QT.F32 if len(t.shape) == 1 or t.kind in ("router", "conv") else qt


def planned_bytes(arch: str, preset: str, quant: str, layers: int | None = None, experts: int | None = None) -> int:
    """Tensor bytes a full-size preset will write (for progress); 0 for small presets."""
    shape = resolve_shape(arch, preset, layers, experts)
    if not shape.full_size or quant.upper() not in MIX_NAMES:
        return 0
    n_all = shape.n_layer + shape.n_nextn
    return sum(stored_nbytes(t.shape, mix_qtype(quant.upper(), t.name, n_all, shape=t.shape)) for t in tensor_plan(arch, shape))
