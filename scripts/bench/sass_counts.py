"""Static SASS counts of the decode kernels, on a machine without a GPU: each entry's instructions and its largest
loop's (the span of its longest backward branch), as JSON.

nvcc builds cuda/<file>.cu for sm_90 with the given defines; cuobjdump disassembles it. Neither needs a GPU.
cuobjdump comes from the `nvidia-cuda-cuobjdump` wheel if the CUDA install lacks it:
`pip download --no-deps nvidia-cuda-cuobjdump`, then unzip it (nvidia/cu13/bin/cuobjdump).
This is a count, not a speed: docs/perf/2026-12-08-decode-kernels-sass-cpu.md reads it beside ncu's times.

    python -m scripts.bench.sass_counts --cuobjdump /tmp/nvd/nvidia/cu13/bin/cuobjdump --file gemv \\
        -D GEMV_UNIT=UnitQ4_K -D GEMV_COLUMNS=1 -D GEMV_THREADS=128 --entry expert_gate_up --entry gemv_r1 \\
        --out counts.json
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

CUDA_DIR = Path(__file__).resolve().parent.parent.parent / "cuda"
_FUNCTION = re.compile(r"\n\s+Function : (\S+)")
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_BACKWARD = re.compile(r"BRA\s+(?:`?\(?)0x([0-9a-f]+)")


def count(sass: str) -> dict[str, dict[str, int]]:
    """Per function of cuobjdump -sass text: its instructions, and its largest loop's (a branch to an earlier
    address spans a loop: the instructions from the target to the branch)."""
    counts = {}
    names = _FUNCTION.findall(sass)
    bodies = _FUNCTION.split(sass)[2::2]
    for name, body in zip(names, bodies):
        instructions = _INSTRUCTION.findall(body)
        loop = 0
        for address, text in instructions:
            target = _BACKWARD.search(text)
            if target and int(target.group(1), 16) < int(address, 16):
                loop = max(loop, (int(address, 16) - int(target.group(1), 16)) // 16 + 1)
        counts[name] = {"instructions": len(instructions), "largest_loop": loop}
    return counts


def build(nvcc: str, source: Path, defines: list[str], out: Path) -> None:
    subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-cubin", f"-I{source.parent}", *(f"-D{d}" for d in defines),
                    str(source), "-o", str(out)], check=True, capture_output=True, text=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default="gemv", help="cuda/<file>.cu [default: gemv]")
    ap.add_argument("-D", dest="defines", action="append", default=[], help="NAME=VALUE (repeatable)")
    ap.add_argument("--entry", action="append", default=[], help="entries to keep (repeatable; default: all)")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "module.cubin"
        build(args.nvcc, CUDA_DIR / f"{args.file}.cu", args.defines, cubin)
        sass = subprocess.run([args.cuobjdump, "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    counts = count(sass)
    if args.entry:
        counts = {name: c for name, c in counts.items() if name in args.entry}
    nvcc_version = subprocess.run([args.nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    record: dict[str, Any] = {"benchmark": "sass_counts", "file": f"cuda/{args.file}.cu", "defines": args.defines,
                              "arch": "sm_90", "nvcc": nvcc_version[-1] if nvcc_version else None, "entries": counts}
    args.out.write_text(json.dumps(record, indent=2))
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
