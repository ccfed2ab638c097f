"""Choosing the ops backend: `cuda` when a GPU is there (or asked for), else the numpy reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from runner.backends.budget import GIB
from runner.backends.kv_type import DEFAULT_KV_TYPE, KVType, check_kv_type
from runner.errors import RunnerError
from runner.launch.profiles import check_vram_budget

BackendName = Literal["auto", "cuda", "numpy"]
BACKEND_NAMES = ("auto", "cuda", "numpy")


class BackendError(RunnerError):
    """The requested backend cannot run here."""


@dataclass(frozen=True)
class BackendConfig:
    name: BackendName = "auto"
    vram_budget_gib: float | None = None  # None: the card's free memory
    kv_type: KVType = DEFAULT_KV_TYPE  # the K/V cache's element type (--cache-type)

    def __post_init__(self) -> None:
        if self.name not in BACKEND_NAMES:
            raise BackendError(f"unknown backend '{self.name}'; choose from {', '.join(BACKEND_NAMES)}")
        check_kv_type(self.kv_type, BackendError)
        if self.vram_budget_gib is not None:
            check_vram_budget(self.vram_budget_gib, BackendError)


def make_ops(config: BackendConfig) -> Any:
    """The ops object for `config`; `cuda` without CuPy or a GPU is a one-line error, never a fallback."""
    from runner.backends.cuda.kernels import CudaUnavailable, gpu_available

    name = config.name
    if name == "auto":
        name = "cuda" if gpu_available() else "numpy"
    if name == "numpy":
        if config.vram_budget_gib is not None and config.name == "numpy":
            raise BackendError("--vram-budget applies to the cuda backend only")
        from runner.backends.numpy.ops import NumpyOps

        return NumpyOps(kv_type=config.kv_type)
    try:
        from runner.backends.cuda.kernels import _require_gpu

        _require_gpu()
    except CudaUnavailable as exc:
        raise BackendError(f"--backend cuda: {exc}") from None
    from runner.backends.budget import DeviceBudget
    from runner.backends.cuda.ops import CudaOps, free_device_bytes

    free = free_device_bytes()
    limit = free if config.vram_budget_gib is None else int(config.vram_budget_gib * GIB)
    if limit > free:
        raise BackendError(
            f"--vram-budget {config.vram_budget_gib} GiB is more than the {free / GIB:.1f} GiB free on the GPU"
        )
    return CudaOps(DeviceBudget(limit), kv_type=config.kv_type)
