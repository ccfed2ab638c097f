"""Large-batch products for prefill: dequantize the weight to fp16, then one tensor-core GEMM.

fp16 operands with float32 accumulation and a float32 result; the weight's fp16 copy is a transient
workspace, never kept. The GEMM is `linear_rows` (cuda/moe_prefill.cu), whose rows do not depend on
the other rows of the batch (the experts' products share its tiles), so a prompt's projections give
the same bits whether its micro-batches run one by one or together; DENSE_GEMM = "cublas" switches
to cublasGemmEx for comparison (its kernel choice depends on the batch's size). `precision="f32"`
dequantizes to float32 and runs SGEMM instead (slower, for checks). The twin is `x @ dequantize(w).T`.
"""

from __future__ import annotations

from functools import lru_cache

import cupy as cp
import numpy as np
from cupy.cuda import cublas, device, runtime

from runner.backends.cuda.dequant import dequantize
from runner.backends.cuda.moe_prefill import K_STEP, MP_THREADS, tile_kernel, tile_shared_bytes

_COMPUTE_32F = getattr(cublas, "CUBLAS_COMPUTE_32F", 68)
_GEMM_DEFAULT = -1
_ONE = np.array(1.0, dtype=np.float32)
_ZERO = np.array(0.0, dtype=np.float32)
DENSE_GEMM = "rows"  # or "cublas"
ROW_TILE, SMALL_ROW_TILE, COL_TILE = 128, 64, 128  # LINEAR_BM, linear_rows_64's, LINEAR_BN in moe_prefill.cu


def row_tile(t: int, n: int) -> int:
    """linear_rows' 128-row tiles, or 64-row ones (linear_rows_64) where 128 would leave SMs idle; same bits."""
    blocks = -(-t // ROW_TILE) * -(-n // COL_TILE)
    return ROW_TILE if blocks >= _sm_count() else SMALL_ROW_TILE


@lru_cache(maxsize=None)
def _sm_count() -> int:
    return int(device.Device().attributes["MultiProcessorCount"])


def matmul_rows(x: cp.ndarray, w16: cp.ndarray, out: cp.ndarray | None = None) -> cp.ndarray:
    """x [T, K] (float32, rounded to fp16 on load) times w16 [N, K] (float16) transposed -> float32 [T, N]."""
    assert x.dtype == cp.float32 and w16.dtype == cp.float16, "x must be float32 and the weight float16"
    assert x.flags.c_contiguous and w16.flags.c_contiguous, "operands must be C-contiguous"
    (t, k), (n, k2) = x.shape, w16.shape
    assert k == k2 and k % K_STEP == 0, f"x has {k} columns, the weight {k2}; both must be a multiple of {K_STEP}"
    out = cp.empty((t, n), dtype=cp.float32) if out is None else out
    assert out.shape == (t, n) and out.dtype == cp.float32 and out.flags.c_contiguous
    if t and n:
        rows = row_tile(t, n)
        shared = tile_shared_bytes(rows, COL_TILE)
        grid = -(-t // rows) * -(-n // COL_TILE)  # column tiles fastest
        tile_kernel("linear_rows" if rows == ROW_TILE else "linear_rows_64", shared)(
            (grid,), (MP_THREADS,), (x, w16, np.int32(t), np.int32(n), np.int32(k), out), shared_mem=shared)
    return out


def matmul_t(x: cp.ndarray, w16: cp.ndarray, out: cp.ndarray | None = None) -> cp.ndarray:
    """x [T, K] (float16) times w16 [N, K] (float16) transposed -> float32 [T, N]."""
    assert x.dtype == cp.float16 and w16.dtype == cp.float16, "operands must be float16"
    assert x.flags.c_contiguous and w16.flags.c_contiguous, "operands must be C-contiguous"
    (t, k), (n, k2) = x.shape, w16.shape
    assert k == k2, f"x has {k} columns, the weight {k2}"
    out = cp.empty((t, n), dtype=cp.float32) if out is None else out
    assert out.shape == (t, n) and out.dtype == cp.float32 and out.flags.c_contiguous
    if t and n:
        # Row-major out[T, N] is column-major out^T = W (op T on the K x N view) times x^T.
        handle = device.get_cublas_handle()
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
        cublas.gemmEx(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n, t, k,
                      _ONE.ctypes.data, w16.data.ptr, runtime.CUDA_R_16F, k,
                      x.data.ptr, runtime.CUDA_R_16F, k,
                      _ZERO.ctypes.data, out.data.ptr, runtime.CUDA_R_32F, n, _COMPUTE_32F, _GEMM_DEFAULT)
    return out


def linear_large(x: cp.ndarray, raw: cp.ndarray, qtype, row_length: int, precision: str = "f16") -> cp.ndarray:
    """x [T, K] float32 times the GGUF weight `raw` [N, row_bytes] transposed -> float32 [T, N]."""
    assert x.dtype == cp.float32 and x.ndim == 2 and x.shape[1] == row_length
    if precision == "f32":
        return x @ dequantize(raw, qtype, row_length, np.float32).T
    assert precision == "f16", f"precision must be f16 or f32, got {precision}"
    w16 = dequantize(raw, qtype, row_length, np.float16)
    if DENSE_GEMM == "rows" and row_length % K_STEP == 0:
        return matmul_rows(cp.ascontiguousarray(x), w16)
    return matmul_t(cp.ascontiguousarray(x.astype(cp.float16)), w16)
