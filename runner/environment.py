"""The environment a measurement ran in (MEASURING.md 7): machine, Python, numpy, CuPy, GPU, driver, commit."""

from __future__ import annotations

import datetime
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def git_commit(repo: Path = REPO) -> dict[str, Any]:
    """The checkout's commit and whether it has uncommitted changes (None where it is not a git checkout)."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": head, "dirty": bool(dirty)}


def environment() -> dict[str, Any]:
    import numpy as np

    env: dict[str, Any] = {
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "platform": platform.platform(), "cpu_count": _cpu_count(),
        "python": sys.version.split()[0], "numpy": np.__version__, **git_commit(),
    }
    env.update(gpu_environment())
    return env


def gpu_environment() -> dict[str, Any]:
    """CuPy, the GPU, driver and CUDA runtime; {"gpu": None} without one."""
    from runner.backends.cuda.kernels import gpu_available

    if not gpu_available():
        return {"gpu": None}
    import cupy as cp

    rt = cp.cuda.runtime
    props = rt.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"]
    return {"gpu": name.decode() if isinstance(name, bytes) else str(name), "gpu_memory_bytes": int(props["totalGlobalMem"]),
            "cuda_driver": rt.driverGetVersion(), "cuda_runtime": rt.runtimeGetVersion(), "cupy": cp.__version__}


def pinned_h2d_gb_s(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """The best of `repeats` pinned host-to-device copies of `nbytes`, in GB/s (CUDA events)."""
    import cupy as cp

    from runner.backends.cuda.expert_arena import pinned_host

    host = pinned_host(nbytes).array
    device = cp.empty(nbytes, dtype=cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    best = float("inf")
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        cp.cuda.runtime.memcpyAsync(device.data.ptr, host.ctypes.data, nbytes, 1, stream.ptr)  # 1: host to device
        end.record(stream)
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, end) / 1e3)
    return nbytes / best / 1e9


def _cpu_count() -> int | None:
    import os

    return os.cpu_count()
