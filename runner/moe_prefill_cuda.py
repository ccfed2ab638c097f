"""Routed experts for a prompt micro-batch: tokens grouped by expert, chunks of experts per batched GEMM.

Per chunk of C experts: their gate, up and down matrices dequantized to fp16 in one launch each (an
expert tensor's experts are consecutive rows), the chunk's tokens gathered into a [C, max_rows, K]
fp16 buffer padded to the busiest expert's row count, then one strided-batched cuBLAS GEMM per
matrix (fp16 operands, float32 accumulation). Each pair's output lands in its own row and the
per-token combine sums a token's experts in slot order, so the result is deterministic (no atomics).
The numpy twin is NumpyOps.moe.
"""

from __future__ import annotations

import cupy as cp
import numpy as np
from cupy.cuda import cublas, device, runtime

from .cuda_kernels import load_module
from .dequant_cuda import dequantize
from .device_weights import DeviceTensor

_COMPUTE_32F = getattr(cublas, "CUBLAS_COMPUTE_32F", 68)
_ONE = np.array(1.0, dtype=np.float32)
_ZERO = np.array(0.0, dtype=np.float32)
PAD_THREADS = 256  # PAD_THREADS in moe_prefill.cu
CHUNK_WEIGHT_BYTES = 512 << 20  # fp16 weights of one chunk's three matrices, at most (about)


def batched_matmul_t(x: cp.ndarray, w: cp.ndarray) -> cp.ndarray:
    """x [C, M, K] fp16 times w [C, N, K] fp16 transposed, per batch -> float32 [C, M, N]."""
    (c, m, k), (c2, n, k2) = x.shape, w.shape
    assert c == c2 and k == k2 and x.dtype == w.dtype == cp.float16
    assert x.flags.c_contiguous and w.flags.c_contiguous
    out = cp.empty((c, m, n), dtype=cp.float32)
    if c and m and n:
        handle = device.get_cublas_handle()
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
        # Column-major per batch: out^T [N, M] = W (op T of its K x N view) times x^T [K, M].
        cublas.gemmStridedBatchedEx(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n, m, k,
                                    _ONE.ctypes.data, w.data.ptr, runtime.CUDA_R_16F, k, n * k,
                                    x.data.ptr, runtime.CUDA_R_16F, k, m * k,
                                    _ZERO.ctypes.data, out.data.ptr, runtime.CUDA_R_32F, n, m * n,
                                    c, _COMPUTE_32F, -1)
    return out


def group_by_expert(ids: cp.ndarray, n_expert: int) -> tuple[cp.ndarray, cp.ndarray]:
    """Pairs sorted by expert (stable) and each expert's [offsets[e], offsets[e+1]) range."""
    flat = ids.reshape(-1)
    order = cp.argsort(flat, kind="stable").astype(cp.int32)
    offsets = cp.searchsorted(flat[order], cp.arange(n_expert + 1, dtype=flat.dtype)).astype(cp.int32)
    return order, offsets


def moe_prefill(x: cp.ndarray, ids: cp.ndarray, gate: DeviceTensor, up: DeviceTensor,
                down: DeviceTensor) -> cp.ndarray:
    """Each pair's expert output, [T * k, n_embd] float32, row p = t * k + j (unweighted)."""
    module = load_module("moe_prefill")
    n_tok, k = ids.shape
    n_expert = gate.shape[0]
    n_ff, width = gate.rows_per_expert, x.shape[1]
    order, offsets = group_by_expert(ids, n_expert)
    counts = np.diff(cp.asnumpy(offsets))  # the one host sync: chunk sizes decide the launches
    y_pairs = cp.empty((n_tok * k, down.rows_per_expert), dtype=cp.float32)
    per_expert_f16 = 2 * (2 * n_ff * width + down.rows_per_expert * n_ff)
    chunk = max(1, CHUNK_WEIGHT_BYTES // per_expert_f16)
    active = np.nonzero(counts)[0]
    e0 = int(active[0]) if len(active) else n_expert
    while e0 < n_expert:
        e1 = min(n_expert, e0 + chunk)
        c, max_rows = e1 - e0, int(counts[e0:e1].max())
        xp = cp.empty((c, max_rows, width), dtype=cp.float16)
        module.get_function("gather_padded_f16")(
            (max_rows, c), (PAD_THREADS,),
            (x, order, offsets, np.int32(k), np.int32(e0), np.int32(max_rows), np.int32(width), xp))
        g = batched_matmul_t(xp, _experts_f16(gate, e0, e1))
        u = batched_matmul_t(xp, _experts_f16(up, e0, e1))
        h = cp.empty(g.shape, dtype=cp.float16)
        n = g.size
        module.get_function("swiglu_to_f16")((min(65536, -(-n // 256)),), (256,), (g, u, h, np.int64(n)))
        y = batched_matmul_t(h, _experts_f16(down, e0, e1))
        module.get_function("scatter_pairs")(
            (max_rows, c), (PAD_THREADS,),
            (y, order, offsets, np.int32(e0), np.int32(max_rows), np.int32(y.shape[2]), y_pairs))
        later = active[active >= e1]
        e0 = int(later[0]) if len(later) else n_expert
    return y_pairs


def _experts_f16(t: DeviceTensor, e0: int, e1: int) -> cp.ndarray:
    n = t.rows_per_expert
    return dequantize(t.raw[e0 * n : e1 * n], t.qtype, t.row_length, np.float16).reshape(e1 - e0, n, t.row_length)
