"""Quantize a GGUF with llama.cpp's own quantizer (`llama_model_quantize`), so mixes are llama.cpp's."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import llama_cpp

from runner.errors import SynthError

LLAMA_MIXES: tuple[str, ...] = tuple(
    sorted(name.removeprefix("LLAMA_FTYPE_MOSTLY_") for name in dir(llama_cpp) if name.startswith("LLAMA_FTYPE_MOSTLY_"))
)


def llama_quantize(src: Path, dst: Path, mix: str, threads: int = 0) -> None:
    """Write `dst` as `src` quantized to the llama.cpp file type `mix` (e.g. Q4_K_M)."""
    if mix not in LLAMA_MIXES:
        raise SynthError(f"unknown quant type '{mix}'; llama.cpp knows {', '.join(LLAMA_MIXES)}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{mix}")
    params.nthread = threads or (os.cpu_count() or 1)
    with _captured_native_stderr() as log:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        last = log.read().decode(errors="replace").strip().splitlines()[-1:] or ["no log"]
        raise SynthError(f"llama.cpp could not quantize to {mix} (code {rc}): {last[0]}")


class _captured_native_stderr:
    """Send the C library's stderr to a temporary file while quantizing; it is chatty."""

    def __enter__(self):
        self._file = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self._file

    def __exit__(self, *exc: object) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
