"""What the benchmark scripts share: the median-with-range summary and the environment record (shared/MEASURING.md)."""

from __future__ import annotations

import platform
import statistics
from typing import Any


def summary(values: list[float]) -> dict[str, float]:
    """Median of the runs with their min, max and count."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def bench_ops(backend: str, vram_budget_gib: float, graphs: bool = True) -> Any:
    """CudaOps under a `vram_budget_gib` budget (decode graphs on or off), or NumpyOps for a dry run of a
    script on the CPU."""
    if backend == "numpy":
        from runner.backends.numpy.ops import NumpyOps

        return NumpyOps()
    from runner.backends.budget import GIB, DeviceBudget
    from runner.backends.cuda.ops import CudaOps

    return CudaOps(DeviceBudget(int(vram_budget_gib * GIB)), graphs=graphs)


def environment(commit: str, argv: dict[str, Any]) -> dict[str, Any]:
    """GPU, driver, CUDA runtime, CuPy, Python, commit and the script's own arguments."""
    base = {"python": platform.python_version(), "commit": commit, "argv": {k: str(v) for k, v in argv.items()}}
    try:
        import cupy as cp
    except ImportError:
        return {**base, "gpu": None, "note": "dry run on the CPU: timings are not GPU timings"}

    props = cp.cuda.runtime.getDeviceProperties(0)
    return {**base, "gpu": props["name"].decode(), "driver": cp.cuda.runtime.driverGetVersion(),
            "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(), "cupy": cp.__version__}
