"""Where a decode token's GPU time goes, kernel by kernel: Nsight Compute's per-launch durations summed by name.

nsys is not on the GPU box, so the table comes from ncu, which times each kernel node of a graph alone
(serialized, caches as the previous launch left them): the sums are the kernels' own times, not the graph's
wall time (no overlap, no launch gaps), which is what ranks them. Record the launches with

    ncu --profile-from-start off --graph-profiling node --metrics gpu__time_duration.sum --csv --page raw \\
        --print-units base python -m scripts.bench.bench_resident_cuda MODEL.gguf ... --profile-tokens 8 > raw.csv

then `python -m scripts.bench.kernel_table raw.csv --tokens 8 --out table.json` (a benchmark's JSON, not a test).
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

DURATION = "gpu__time_duration.sum"
NAME_COLUMNS = ("Kernel Name", "Function Name")
UNIT_SCALE_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}


def launches(lines: Iterable[str]) -> list[tuple[str, str, float]]:
    """(kernel name, grid size, microseconds) of each launch in ncu's raw CSV; the lines before its header (the
    profiled program's own output, ncu's ==PROF== notes) are skipped."""
    rows = csv.reader(line for line in lines if line.startswith('"'))
    header = next((r for r in rows if DURATION in r and any(c in r for c in NAME_COLUMNS)), None)
    if header is None:
        raise ValueError(f"no CSV header with a kernel name column and {DURATION}: was ncu run with --csv --page raw?")
    name_at = next(header.index(c) for c in NAME_COLUMNS if c in header)
    grid_at = header.index("Grid Size") if "Grid Size" in header else None
    at = header.index(DURATION)
    scale, out = 1e-3, []  # --print-units base: nanoseconds
    for r in rows:
        if len(r) <= at:
            continue
        value = r[at].replace(",", "")
        if r[0] == "" and value in UNIT_SCALE_US:  # the units row under the header
            scale = UNIT_SCALE_US[value]
            continue
        try:
            out.append((r[name_at], r[grid_at] if grid_at is not None else "", float(value) * scale))
        except ValueError:
            continue
    return out


def table(found: list[tuple[str, str, float]], tokens: int) -> dict[str, Any]:
    """Per kernel name: launches and microseconds per token, the mean launch, the grids seen, the share of the
    sum; heaviest first."""
    by_name: dict[str, list[float]] = defaultdict(list)
    grids: dict[str, set[str]] = defaultdict(set)
    for name, grid, us in found:
        by_name[name].append(us)
        grids[name].add(grid)
    total = sum(us for _, _, us in found)
    kernels = [{"kernel": name, "launches_per_token": len(times) / tokens, "us_per_token": sum(times) / tokens,
                "mean_us": sum(times) / len(times), "min_us": min(times), "max_us": max(times),
                "share": sum(times) / total if total else 0.0, "grids": sorted(grids[name])}
               for name, times in by_name.items()]
    kernels.sort(key=lambda k: -k["us_per_token"])
    return {"tokens": tokens, "launches_per_token": len(found) / tokens, "kernel_ms_per_token": total / tokens / 1e3,
            "kernels": kernels}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path, help="ncu's --csv --page raw output with gpu__time_duration.sum")
    ap.add_argument("--tokens", type=int, required=True, help="decode tokens inside the profiled range")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--label", default="", help="what was profiled (model, resident or offloaded, commit)")
    args = ap.parse_args()
    found = launches(args.csv.read_text(errors="replace").splitlines())
    if not found:
        raise SystemExit(f"{args.csv}: no profiled launches (was the range empty?)")
    result = {"benchmark": "kernel_table", "label": args.label, "source": args.csv.name, **table(found, args.tokens)}
    args.out.write_text(json.dumps(result, indent=2))
    for k in result["kernels"][:15]:
        print(f"{k['us_per_token']:9.1f} us  {k['launches_per_token']:6.1f} x {k['mean_us']:7.2f} us  {k['kernel']}")
    print(f"{result['kernel_ms_per_token']:.3f} ms of kernels and {result['launches_per_token']:.0f} launches a token")


if __name__ == "__main__":
    main()
