"""The one loader of the CUDA kernels: compiles `cuda/<name>.cu` with CuPy once per process and caches it.

CuPy is imported only when a module is first loaded, so this file imports cleanly without it.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from runner.backends.cuda.launch import Module
from runner.package_data import kernel_dir


class CudaUnavailable(RuntimeError):
    """The CUDA backend cannot run here: CuPy is not installed or no NVIDIA GPU is visible."""


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device; never raises."""
    try:
        _require_gpu()
    except Exception:
        return False
    return True


@lru_cache(maxsize=None)
def load_module(name: str, defines: tuple[str, ...] = ()) -> Module:
    """The compiled `cuda/<name>.cu` (with `-D` of each of `defines`, e.g. "GEMV_UNIT=UnitQ4_K") as a
    RawModule whose kernels launch through launch.Kernel (PDL where on), once per (name, defines); raises
    CudaUnavailable without CuPy or a GPU."""
    cupy = _require_gpu()
    source_dir = _source_dir()
    path = source_dir / f"{name}.cu"
    if not name.isidentifier() or not path.is_file():
        known = ", ".join(sorted(p.stem for p in source_dir.glob("*.cu")))
        raise ValueError(f"no kernel file cuda/{name}.cu; have {known}")
    # CuPy caches compiled modules by source and options, not by included headers: the headers'
    # digest in a -D option makes an edited .cuh recompile its users.
    # -I: kernel files `#include "blocks.cuh"` and friends (NVRTC has no file's directory to search).
    # The defines go into the source, not the options: CuPy runs NVRTC once per distinct option set even when
    # the module itself comes from its disk cache (about 20 ms each, in a request's time to first token).
    options = ("-std=c++17", f"-I{source_dir}", f"-DRUNNER_HEADERS_DIGEST={_headers_digest(source_dir)}")
    module = cupy.RawModule(code=_with_defines(path.read_text(), defines), options=options)
    module.compile()  # compile now, so a source error surfaces here and not at the first launch
    return Module(module, name)


def _with_defines(source: str, defines: tuple[str, ...]) -> str:
    """`source` after a `#define NAME VALUE` line per "NAME=VALUE" (or "NAME") of `defines`, as -D would give."""
    lines = []
    for d in defines:
        name, _, value = d.partition("=")
        lines.append(f"#define {name} {value or 1}")
    return "".join(line + "\n" for line in lines) + source if lines else source


@lru_cache(maxsize=1)
def _source_dir() -> Path:
    found = kernel_dir()
    if found is None:
        raise CudaUnavailable("this installation of the runner has no CUDA kernel sources (runner.kernels); "
                              "reinstall it with `pip install .`")
    return found


def _headers_digest(source_dir: Path) -> str:
    digest = hashlib.sha256()
    for header in sorted(source_dir.glob("*.cuh")):
        digest.update(header.name.encode() + b"\0" + header.read_bytes())
    return digest.hexdigest()[:16]


def _require_gpu():
    try:
        import cupy
    except ImportError as e:
        raise CudaUnavailable(
            f"the CUDA backend needs CuPy (pip install 'moe-offload-runner[cuda13]' or [cuda12]): {e}"
        ) from e
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError when there is no driver or no device
        raise CudaUnavailable(f"the CUDA backend needs an NVIDIA GPU, and CuPy found none: {e}") from e
    if count < 1:
        raise CudaUnavailable("the CUDA backend needs an NVIDIA GPU, and CuPy found none")
    return cupy
