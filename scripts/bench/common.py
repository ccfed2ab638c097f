"""What the benchmark scripts share: the median-with-range summary, the ops to measure with, and the
environment record (shared/MEASURING.md)."""

from __future__ import annotations

import statistics
from typing import Any

from runner.environment import environment as runner_environment


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


def environment(commit: str | None = None, argv: dict[str, Any] | None = None) -> dict[str, Any]:
    """runner.environment's record (machine, Python, numpy, CuPy, GPU, driver, commit) plus the script's own
    arguments. `commit` (a script's --commit) stands in for the checkout's, for a copy of the tree without git."""
    env = runner_environment()
    if commit:
        env["commit"] = commit
    if argv is not None:
        env["argv"] = {k: str(v) for k, v in argv.items()}
    if env["gpu"] is None:
        env["note"] = "dry run on the CPU: timings are not GPU timings"
    return env
