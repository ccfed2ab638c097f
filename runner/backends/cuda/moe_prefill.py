"""Routed experts for a prompt micro-batch: tokens grouped by expert, chunks of experts per batched GEMM.

Per chunk of C experts that have tokens: their gate, up and down matrices dequantized to fp16 in one
launch each (from each expert's device address, so resident tensors, cache slots and prefill
staging buffers are all read the same way), the chunk's tokens gathered into a [C, max_rows, K]
fp16 buffer padded to the busiest expert's row count, then one strided-batched cuBLAS GEMM per
matrix (fp16 operands, float32 accumulation). Each pair's output lands in its own row and the
per-token combine sums a token's experts in slot order, so the result is deterministic (no atomics).
The numpy twin is NumpyOps.moe.
"""

from __future__ import annotations

from dataclasses import dataclass

import cupy as cp
import numpy as np
from cupy.cuda import cublas, device, runtime
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.cuda.dequant import dequantize_gather
from runner.backends.cuda.device_weights import DeviceTensor
from runner.backends.cuda.kernels import load_module

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


@dataclass(frozen=True)
class ExpertMatrixSet:
    """One of an MoE layer's three matrices for every expert: its type, shape and each expert's device address.

    The experts may sit anywhere: one resident tensor, cache slots, a prefill staging buffer.
    """

    qtype: QT
    rows: int  # rows per expert
    row_length: int
    ptrs: np.ndarray  # uint64 [n_expert] on the host; 0 where the expert is not on the device

    @classmethod
    def resident(cls, t: DeviceTensor) -> "ExpertMatrixSet":
        """Every expert of a resident [n_expert * rows, row_bytes] tensor."""
        n = np.arange(t.shape[0], dtype=np.uint64)
        return cls(t.qtype, t.rows_per_expert, t.row_length, np.uint64(t.raw.data.ptr) + n * np.uint64(t.expert_bytes))

    def dense(self, experts: np.ndarray, dtype=np.float16) -> cp.ndarray:
        """These experts' matrices dequantized, [len(experts), rows, row_length] of `dtype`."""
        ptrs = self.ptrs[experts]
        if not ptrs.all():
            missing = [int(e) for e, p in zip(experts, ptrs) if not p]
            raise ValueError(f"experts {missing} were routed to but are not on the device")
        return dequantize_gather(cp.asarray(ptrs), self.qtype, self.rows, self.row_length, dtype)


def moe_prefill_scratch_bytes(cfg) -> int:
    """Device memory one moe_prefill chunk takes beyond the activations: fp16 weights, their float32
    products and the padded fp16 inputs are bounded by about three chunks' weight bytes."""
    return 3 * CHUNK_WEIGHT_BYTES


def moe_prefill(x: cp.ndarray, ids: cp.ndarray, gate: ExpertMatrixSet, up: ExpertMatrixSet,
                down: ExpertMatrixSet) -> cp.ndarray:
    """Each pair's expert output, [T * k, n_embd] float32, row p = t * k + j (unweighted)."""
    module = load_module("moe_prefill")
    n_tok, k = ids.shape
    n_expert = len(gate.ptrs)
    n_ff, width = gate.rows, x.shape[1]
    order, offsets = group_by_expert(ids, n_expert)
    counts = np.diff(cp.asnumpy(offsets))  # the one host sync: chunk sizes decide the launches
    y_pairs = cp.empty((n_tok * k, down.rows), dtype=cp.float32)
    per_expert_f16 = 2 * (2 * n_ff * width + down.rows * n_ff)
    chunk = max(1, CHUNK_WEIGHT_BYTES // per_expert_f16)
    active = np.nonzero(counts)[0]  # experts with no tokens cost nothing
    for first in range(0, len(active), chunk):
        experts = active[first : first + chunk]
        c, max_rows = len(experts), int(counts[experts].max())
        experts_dev = cp.asarray(experts.astype(np.int32))
        xp = cp.empty((c, max_rows, width), dtype=cp.float16)
        module.get_function("gather_padded_f16")(
            (max_rows, c), (PAD_THREADS,),
            (x, order, offsets, experts_dev, np.int32(k), np.int32(max_rows), np.int32(width), xp))
        g = batched_matmul_t(xp, gate.dense(experts))
        u = batched_matmul_t(xp, up.dense(experts))
        h = cp.empty(g.shape, dtype=cp.float16)
        n = g.size
        module.get_function("swiglu_to_f16")((min(65536, -(-n // 256)),), (256,), (g, u, h, np.int64(n)))
        y = batched_matmul_t(h, down.dense(experts))
        module.get_function("scatter_pairs")(
            (max_rows, c), (PAD_THREADS,),
            (y, order, offsets, experts_dev, np.int32(max_rows), np.int32(y.shape[2]), y_pairs))
    return y_pairs
