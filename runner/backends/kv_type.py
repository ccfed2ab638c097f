"""The attention K/V cache's element type (`--cache-type`, llama.cpp's --cache-type-k/-v): f16 by default,
as llama.cpp stores it, or f32.

Both backends store K/V rounded to the type as it is written (round to nearest even, the same bits on
numpy and CUDA) and compute attention in float32 from it. f16 halves the cache's bytes, and the CUDA
prompt kernel reads it into its fp16 tensor-core tiles as it is.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

KVType = Literal["f16", "f32"]
KV_TYPES: dict[str, np.dtype] = {"f16": np.dtype(np.float16), "f32": np.dtype(np.float32)}
DEFAULT_KV_TYPE: KVType = "f16"  # llama.cpp's default (--cache-type-k f16 --cache-type-v f16)


def check_kv_type(name: object, error: type[Exception] = ValueError) -> KVType:
    """`name` when it is a K/V cache type this runner stores; else one `error` line saying which are."""
    if not isinstance(name, str) or name not in KV_TYPES:
        raise error(f"--cache-type must be f16 (the default, llama.cpp's) or f32, got {name!r}; "
                    f"quantized K/V caches (q8_0, q4_0, ...) are not supported")
    return name  # type: ignore[return-value]


def kv_dtype(kv_type: str) -> np.dtype:
    return KV_TYPES[check_kv_type(kv_type)]


def kv_value_bytes(kv_type: str) -> int:
    """Bytes of one cached K or V element."""
    return kv_dtype(kv_type).itemsize
