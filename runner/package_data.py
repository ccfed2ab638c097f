"""The data the installed package ships beside its code: CUDA kernel sources, launch profiles, the demo model.

The repository keeps them in the top-level `cuda/` and `profiles/` folders; `runner/kernels` and
`runner/profiles` link to them, so a checkout, an editable install and a wheel (which holds copies)
all find them as the data packages `runner.kernels` and `runner.profiles` through importlib.resources.
Neither folder holds an `__init__.py`: a top-level `cuda` package would shadow NVIDIA's `cuda`
namespace that CuPy imports.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def data_dir(package: str, pattern: str) -> Path | None:
    """The folder of the data package `package` holding files that match `pattern`; None without one."""
    try:
        root = files(package)
    except ModuleNotFoundError:
        return None
    for entry in root.iterdir():
        path = Path(str(entry))
        if path.match(pattern) and path.is_file():
            return path.parent
    return None


def kernel_dir() -> Path | None:
    """The folder of the CUDA kernel sources (`*.cu`, `*.cuh`), or None when the package ships none."""
    return data_dir("runner.kernels", "*.cu")


def demo_model_path() -> Path | None:
    """The embedded demo model (docs/demo-model.md), or None when the package ships none."""
    folder = data_dir("runner.data", "demo.gguf")
    return folder / "demo.gguf" if folder is not None else None


def profile_dir() -> Path | None:
    """The folder of the launch profiles (`*.toml`), or None when the package ships none."""
    return data_dir("runner.profiles", "*.toml")
