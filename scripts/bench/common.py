"""What the benchmark scripts share: the median-with-range summary, the ops to measure with, and the
environment record (shared/MEASURING.md)."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

from runner.environment import environment as runner_environment


def summary(values: list[float]) -> dict[str, float]:
    """Median of the runs with their min, max and count."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def spin_kernel() -> Any:
    """A one-thread kernel that spins for `cycles` GPU clocks: queued before a timed launch, it keeps the GPU
    busy while the host enqueues, so the events around the launch time the kernels and not the host's launching
    (bench_gemv_cuda; decode_ops --queue-ahead-us)."""
    import cupy as cp

    return cp.RawKernel(r"""extern "C" __global__ void spin(long long cycles) {
        const long long start = clock64();
        while (clock64() - start < cycles) {}
    }""", "spin")


def older_kernel(rev_or_file: str, name: str, *defines: str) -> tuple[str, Any]:
    """Another version of cuda/<name>.cu, named by a file or a git revision (`git show REV:cuda/<name>.cu`; a
    copy of the tree without git history needs the file), compiled apart with CuPy against today's headers:
    its source (whose conventions a caller may need to read) and its RawModule."""
    import cupy as cp

    from runner.package_data import kernel_dir

    path = Path(rev_or_file)
    if path.is_file():
        source = path.read_text()
    else:
        shown = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[2]), "show",
                                f"{rev_or_file}:cuda/{name}.cu"], capture_output=True, text=True)
        if shown.returncode:
            raise SystemExit(f"--against {rev_or_file}: not a file, and git cannot show that revision's "
                             f"cuda/{name}.cu: {shown.stderr.strip()}")
        source = shown.stdout
    module = cp.RawModule(code=source, options=("-std=c++17", f"-I{kernel_dir()}", *(f"-D{d}" for d in defines)))
    module.compile()
    return source, module


def bench_ops(backend: str, vram_budget_gib: float | None, graphs: bool = True) -> Any:
    """CudaOps under a `vram_budget_gib` budget (None: the device's free memory; decode graphs on or off), or
    NumpyOps for a dry run of a script on the CPU."""
    if backend == "numpy":
        from runner.backends.numpy.ops import NumpyOps

        return NumpyOps()
    from runner.backends.budget import GIB, DeviceBudget
    from runner.backends.cuda.ops import CudaOps

    return CudaOps(DeviceBudget(int(vram_budget_gib * GIB)) if vram_budget_gib is not None else None, graphs=graphs)


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


def write_result(result: dict[str, Any], out: Path | None) -> None:
    """The benchmark's JSON to --out, or to stdout without one."""
    text = json.dumps(result, indent=1)
    if out:
        out.write_text(text)
    else:
        print(text)
