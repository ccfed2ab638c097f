"""GGUF block dequantization on the GPU (kernels in cuda/dequant.cu); the numpy twin is gguf.quants.dequantize."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.cuda.kernels import load_module

if TYPE_CHECKING:
    import cupy

# F32 needs no kernel (a copy); the rest each have dequant_<name>_{f32,f16} in cuda/dequant.cu.
_KERNEL_QTYPES = (
    QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1,
    QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_NL, QT.IQ4_XS, QT.MXFP4,
    QT.IQ1_S, QT.IQ1_M, QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ3_XXS, QT.IQ3_S, QT.TQ1_0, QT.TQ2_0,
)
SUPPORTED_QTYPES: frozenset[QT] = frozenset((QT.F32, *_KERNEL_QTYPES))
_OUT_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}
_THREADS = 256  # DEQUANT_THREADS in dequant.cu
_MAX_GRID = 1 << 16  # the kernels stride over the rest


def dequantize(raw: "cupy.ndarray", qtype: QT | int, row_length: int, out_dtype=np.float32) -> "cupy.ndarray":
    """Values of `raw` [rows, row_bytes] (uint8 GGUF blocks of `qtype`) as a new [rows, row_length] array."""
    qtype = QT(qtype)
    if qtype not in SUPPORTED_QTYPES:
        names = ", ".join(sorted(t.name for t in SUPPORTED_QTYPES))
        raise ValueError(f"no CUDA dequantizer for {qtype.name}; supported: {names}")
    module = load_module("dequant")  # raises CudaUnavailable without CuPy or a GPU
    import cupy

    out_dtype = np.dtype(out_dtype)
    assert out_dtype in _OUT_SUFFIX, f"out_dtype must be float32 or float16, got {out_dtype}"
    assert isinstance(raw, cupy.ndarray), f"raw must be a cupy.ndarray, got {type(raw).__name__}"
    assert raw.dtype == np.uint8 and raw.ndim == 2, f"raw must be 2-D uint8, got {raw.ndim}-D {raw.dtype}"
    assert raw.flags.c_contiguous, "raw must be C-contiguous"
    block, type_size = GGML_QUANT_SIZES[qtype]
    assert row_length > 0 and row_length % block == 0, (
        f"row length {row_length} is not a positive multiple of {qtype.name}'s block size {block}"
    )
    row_bytes = row_length // block * type_size
    assert raw.shape[1] == row_bytes, (
        f"{qtype.name} rows of {row_length} values take {row_bytes} bytes, raw has {raw.shape[1]}"
    )
    rows = raw.shape[0]
    if qtype == QT.F32:
        return raw.view(cupy.float32).astype(out_dtype)
    out = cupy.empty((rows, row_length), dtype=out_dtype)
    if block == 1:  # F16, BF16: one thread per value, read as 2-byte words
        assert raw.data.ptr % 2 == 0, f"{qtype.name} data must be 2-byte aligned"
        work = rows * row_length
    else:  # one thread per 8 values of a block
        work = rows * row_length // 8
    if work == 0:
        return out
    kernel = module.get_function(f"dequant_{qtype.name.lower()}_{_OUT_SUFFIX[out_dtype]}")
    grid = min(-(-work // _THREADS), _MAX_GRID)
    kernel((grid,), (_THREADS,), (raw, out, np.int64(work)))
    return out


def dequantize_gather(ptrs: "cupy.ndarray", qtype: QT | int, rows: int, row_length: int,
                      out_dtype=np.float16) -> "cupy.ndarray":
    """Values of C experts' [rows, row_bytes] matrices at device addresses `ptrs` (uint64 [C]), as [C, rows, row_length].

    The experts may sit anywhere (cache slots, a staging buffer); each address must be aligned as a
    row of the type is in a CuPy allocation. Same values as `dequantize` of each matrix.
    """
    qtype = QT(qtype)
    if qtype not in SUPPORTED_QTYPES:
        names = ", ".join(sorted(t.name for t in SUPPORTED_QTYPES))
        raise ValueError(f"no CUDA dequantizer for {qtype.name}; supported: {names}")
    module = load_module("dequant")
    import cupy

    out_dtype = np.dtype(out_dtype)
    assert out_dtype in _OUT_SUFFIX, f"out_dtype must be float32 or float16, got {out_dtype}"
    assert isinstance(ptrs, cupy.ndarray) and ptrs.dtype == np.uint64 and ptrs.ndim == 1, "ptrs must be uint64 [C]"
    block, _ = GGML_QUANT_SIZES[qtype]
    assert row_length > 0 and row_length % block == 0, f"row length {row_length} is not whole {qtype.name} blocks"
    n_experts = int(ptrs.shape[0])
    out = cupy.empty((n_experts, rows, row_length), dtype=out_dtype)
    per_expert = rows * row_length if block == 1 else rows * row_length // 8  # values, or groups of 8
    work = n_experts * per_expert
    if work == 0:
        return out
    kernel = module.get_function(f"dequant_{qtype.name.lower()}_{_OUT_SUFFIX[out_dtype]}_gather")
    grid = min(-(-work // _THREADS), _MAX_GRID)
    kernel((grid,), (_THREADS,), (ptrs, out, np.int64(per_expert), np.int64(work)))
    return out
