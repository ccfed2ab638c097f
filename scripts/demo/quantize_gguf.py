"""Requantize a GGUF file with llama.cpp's own quantizer (llama-cpp-python's llama_model_quantize).

The demo model ships as Q5_K_S made this way, to stay under 5 MiB: llama.cpp picks each tensor's type
(Q5_K, Q6_K for the output, Q5_1 for rows of 64 values, which K-quants cannot hold) and keeps 1-D
tensors in F32. Give it an F32 export where there is one; requantizing a Q8_0 file adds Q8_0's
small rounding to the result (docs/demo-model.md measures what that cost the demo).

    python -m scripts.demo.quantize_gguf SRC.gguf DST.gguf [--type Q5_K_S] [--threads N]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path

TYPES = ("Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "Q8_0")


class QuantizeError(Exception):
    pass


def quantize(src: Path, dst: Path, type_name: str = "Q5_K_S", threads: int = 0) -> int:
    """Write `src` requantized to `type_name` at `dst`; its size in bytes."""
    import llama_cpp

    if type_name not in TYPES:
        raise QuantizeError(f"unknown type '{type_name}'; choose from {', '.join(TYPES)}")
    if not src.is_file():
        raise QuantizeError(f"no such file: {src}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name}")
    params.allow_requantize = True  # a Q8_0 source is already quantized
    params.nthread = threads or (os.cpu_count() or 1)
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
        raise QuantizeError(f"llama.cpp could not quantize {src} (its log above says why)")
    return dst.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--type", default="Q5_K_S", choices=TYPES)
    ap.add_argument("--threads", type=int, default=0, help="0: every core")
    args = ap.parse_args()
    size = quantize(args.src, args.dst, args.type, args.threads)
    print(f"wrote {args.dst} ({args.type}, {size:,} bytes)")


if __name__ == "__main__":
    try:
        main()
    except QuantizeError as exc:
        sys.exit(f"error: {exc}")
