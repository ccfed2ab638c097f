"""Routed experts for a prompt: pairs sorted by expert, grouped GEMMs on tensor cores (cuda/moe_prefill.cu).

Experts run in chunks of fixed expert-id ranges (as many as CHUNK_WEIGHT_BYTES of fp16 weights hold):
per chunk the gate, up and down matrices of the experts that have pairs are dequantized to fp16 in
one launch each (from each expert's device address, so resident tensors, cache slots and prefill
staging buffers are read the same way), one grouped launch computes silu(gate) * up for every pair of
the chunk, one computes down, and a per-token combine adds each token's experts in ascending id.
Nothing depends on which other tokens share the batch (see the .cu), so a layer run over a whole
prompt's tokens at once equals it run micro-batch by micro-batch, bit for bit, while each expert's
matrices are dequantized once per call instead of once per micro-batch. The twin is NumpyOps.moe.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import cupy as cp
import numpy as np
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.cuda.dequant import dequantize_gather
from runner.backends.cuda.device_weights import DeviceTensor
from runner.backends.cuda.kernels import load_module
from runner.backends.cuda.launch import Kernel

PAIR_TILE_ROWS = 64  # PAIR_BM in moe_prefill.cu
GATE_UP_TILE_COLS, DOWN_TILE_COLS = 128, 256  # GATE_UP_BN, DOWN_BN
K_STEP = 32  # MP_BK: every row length is a multiple (GGUF rows are whole 32- or 256-value blocks)
MP_STAGES, MP_LD = 3, 40  # shared K steps in flight, shared row stride in halves
MP_THREADS, COMBINE_THREADS = 256, 256
CHUNK_WEIGHT_BYTES = 512 << 20  # fp16 weights of one chunk's three matrices, at most (about)


def group_by_expert(ids: cp.ndarray, n_expert: int) -> tuple[cp.ndarray, cp.ndarray]:
    """Pairs sorted by expert (stable) and each expert's [offsets[e], offsets[e+1]) range."""
    flat = ids.reshape(-1)
    order = cp.argsort(flat, kind="stable").astype(cp.int32)
    offsets = cp.searchsorted(flat[order], cp.arange(n_expert + 1, dtype=flat.dtype)).astype(cp.int32)
    return order, offsets


def pair_tiles(offsets: np.ndarray, experts: np.ndarray) -> np.ndarray:
    """int32 [n, 3] tiles (slot, first sorted row, end row) covering the pairs of `experts` (slot = index in it)."""
    begins, ends = offsets[experts], offsets[experts + 1]
    per = -(-(ends - begins) // PAIR_TILE_ROWS)
    slot = np.repeat(np.arange(len(experts)), per)
    first = np.repeat(begins, per) + PAIR_TILE_ROWS * (np.arange(per.sum()) - np.repeat(np.cumsum(per) - per, per))
    return np.stack([slot, first, np.repeat(ends, per)], axis=1).astype(np.int32)


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

    def addresses(self, experts: np.ndarray) -> np.ndarray:
        """These experts' device addresses (uint64, on the host); every one must be on the device."""
        ptrs = self.ptrs[experts]
        if not ptrs.all():
            missing = [int(e) for e, p in zip(experts, ptrs) if not p]
            raise ValueError(f"experts {missing} were routed to but are not on the device")
        return ptrs

    def dense(self, experts: np.ndarray, dtype=np.float16) -> cp.ndarray:
        """These experts' matrices dequantized, [len(experts), rows, row_length] of `dtype`."""
        return self.dense_at(cp.asarray(self.addresses(experts)), dtype)

    def dense_at(self, ptrs: cp.ndarray, dtype=np.float16) -> cp.ndarray:
        """The matrices at device addresses `ptrs` (uint64 [C], already on the device) dequantized."""
        return dequantize_gather(ptrs, self.qtype, self.rows, self.row_length, dtype)


def tile_shared_bytes(rows: int, cols: int) -> int:
    """Dynamic shared memory of a rows x cols tile (cols summed over its matrices): TileShape::SHARED_BYTES."""
    return MP_STAGES * (rows + cols) * MP_LD * 2


@lru_cache(maxsize=None)
def tile_kernel(name: str, shared_bytes: int) -> Kernel:
    """A moe_prefill.cu GEMM with its dynamic shared-memory ceiling raised once to its tile's (past 48 KiB)."""
    kernel = load_module("moe_prefill").get_function(name)
    kernel.max_dynamic_shared_size_bytes = shared_bytes
    return kernel


def moe_prefill_scratch_bytes(cfg) -> int:
    """Device memory one moe_prefill chunk takes beyond its input and output: the fp16 weights, and the
    chunk's pairs' fp16 intermediates and float32 outputs, bounded by about three chunks' weight bytes."""
    return 3 * CHUNK_WEIGHT_BYTES


def experts_per_chunk(gate: ExpertMatrixSet, down: ExpertMatrixSet) -> int:
    """A fixed expert-id range per chunk, from the shapes alone, so chunks never depend on the batch."""
    per_expert_f16 = 2 * (2 * gate.rows * gate.row_length + down.rows * down.row_length)
    return max(1, CHUNK_WEIGHT_BYTES // per_expert_f16)


def gate_up_kernel(x: cp.ndarray, order: cp.ndarray, k: int, tiles: cp.ndarray, g16: cp.ndarray, u16: cp.ndarray,
                   base: int, h: cp.ndarray) -> None:
    """h[r - base] = fp16(silu(gate x_r) * up x_r) over `tiles` (int32 [n, 3], on the device); g16, u16 [C, N, K]."""
    n_ff, width = g16.shape[1:]
    grid = len(tiles) * -(-n_ff // GATE_UP_TILE_COLS)  # a tile's column tiles run next to each other
    shared = tile_shared_bytes(PAIR_TILE_ROWS, 2 * GATE_UP_TILE_COLS)
    tile_kernel("moe_gate_up", shared)(
        (grid,), (MP_THREADS,),
        (x, order, np.int32(k), tiles, g16, u16, np.int32(n_ff), np.int32(width), np.int32(base), h), shared_mem=shared)


def down_kernel(h: cp.ndarray, tiles: cp.ndarray, d16: cp.ndarray, base: int, y: cp.ndarray) -> None:
    """y[r - base] = down h[r - base] (float32) over `tiles`; d16 [C, N, K]."""
    n_out, n_ff = d16.shape[1:]
    grid = len(tiles) * -(-n_out // DOWN_TILE_COLS)
    shared = tile_shared_bytes(PAIR_TILE_ROWS, DOWN_TILE_COLS)
    tile_kernel("moe_down", shared)(
        (grid,), (MP_THREADS,), (h, tiles, d16, np.int32(n_out), np.int32(n_ff), np.int32(base), y), shared_mem=shared)


def moe_prefill(x: cp.ndarray, ids: cp.ndarray, weights: cp.ndarray, gate: ExpertMatrixSet, up: ExpertMatrixSet,
                down: ExpertMatrixSet, ids_host: np.ndarray | None = None) -> cp.ndarray:
    """sum over each token's experts of weights[t, j] * down(silu(gate x_t) * up x_t), [T, n_embd] float32.

    `ids_host`: the same ids on the host, when the caller has them (the expert offload does); otherwise
    the experts' pair counts are read back from the device, one sync."""
    module = load_module("moe_prefill")
    n_tok, k = ids.shape
    n_expert, n_ff, width = len(gate.ptrs), gate.rows, x.shape[1]
    assert x.dtype == cp.float32 and x.flags.c_contiguous and gate.row_length == up.row_length == width
    assert up.rows == n_ff and down.row_length == n_ff, "gate, up and down shapes disagree"
    assert width % K_STEP == 0 and n_ff % K_STEP == 0, f"row lengths {width}, {n_ff} must be multiples of {K_STEP}"
    assert n_ff % 2 == 0 and down.rows % 2 == 0
    ids = cp.ascontiguousarray(ids, dtype=cp.int32)
    weights = cp.ascontiguousarray(weights, dtype=cp.float32)
    out = cp.zeros((n_tok, down.rows), dtype=cp.float32)
    if n_tok == 0:
        return out
    if ids_host is None:
        order, offsets_dev = group_by_expert(ids, n_expert)
        offsets = cp.asnumpy(offsets_dev)  # the one host sync: which experts have pairs decides the launches
    else:  # the same grouping, its counts from the host's ids
        order = cp.argsort(ids.reshape(-1), kind="stable").astype(cp.int32)
        offsets = np.concatenate([[0], np.cumsum(np.bincount(ids_host.reshape(-1), minlength=n_expert))])
    inv = cp.empty_like(order)
    inv[order] = cp.arange(order.size, dtype=cp.int32)
    counts = np.diff(offsets)
    chunk = experts_per_chunk(gate, down)
    chunks = []
    for lo in range(0, n_expert, chunk):
        hi = min(lo + chunk, n_expert)
        active = lo + np.nonzero(counts[lo:hi])[0]  # experts with no pairs cost nothing
        if len(active):
            chunks.append((lo, hi, active, pair_tiles(offsets, active)))
    # one upload each for every chunk's tiles and every chunk's gate, up and down addresses (small
    # pageable copies cost about 0.05 ms apiece: one per matrix per chunk was 3% of a seed48 prompt)
    matrices = (gate, up, down)
    all_tiles = cp.asarray(np.concatenate([c[3] for c in chunks]))
    all_ptrs = cp.asarray(np.concatenate([m.addresses(c[2]) for c in chunks for m in matrices]))
    first_tile = first_ptr = 0
    for lo, hi, active, tiles in chunks:
        base, rows = int(offsets[lo]), int(offsets[hi] - offsets[lo])
        tile_ptr = all_tiles[first_tile : first_tile + len(tiles)]
        first_tile += len(tiles)
        g16, u16, d16 = (m.dense_at(all_ptrs[first_ptr + i * len(active) : first_ptr + (i + 1) * len(active)])
                         for i, m in enumerate(matrices))
        first_ptr += len(matrices) * len(active)
        h = cp.empty((rows, n_ff), dtype=cp.float16)
        gate_up_kernel(x, order, k, tile_ptr, g16, u16, base, h)
        y = cp.empty((rows, down.rows), dtype=cp.float32)
        down_kernel(h, tile_ptr, d16, base, y)
        module.get_function("moe_combine_range")(
            (n_tok,), (COMBINE_THREADS,),
            (y, ids, weights, inv, np.int32(k), np.int32(lo), np.int32(hi), np.int32(base), np.int32(down.rows), out))
    return out
