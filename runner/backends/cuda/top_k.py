"""CUDA twin of NumpyOps.top_k (cuda/top_k.cu): a logits row's k best (id, value) pairs on the device, best first,
equal values by lower id (sampling.best_first's order), and whether the row is finite."""

from __future__ import annotations

import cupy as cp
import numpy as np

from runner.backends.cuda.kernels import load_module

TOPK_THREADS = 1024  # top_k.cu's
TOPK_TILE = 2048
TOPK_MAX = 64
TOPK_CANDIDATES = 8192


def fits(n: int, k: int) -> bool:
    """Whether the kernels take a row of n values and this k: 0 < k < n, k <= TOPK_MAX, and the tiles' k best
    each fit the merge (n up to 262144 at k 64, 1.2M at k 40... as TOPK_CANDIDATES allows)."""
    return 0 < k <= TOPK_MAX and k < n and -(-n // TOPK_TILE) * k <= TOPK_CANDIDATES


def top_k(row: cp.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(ids int64 [k], values float32 [k]) of the k largest of the float32 row, largest first, ties to the lower
    id; None when a value is NaN or infinite. Two launches and one download of 1 + 2k ints."""
    assert isinstance(row, cp.ndarray) and row.dtype == cp.float32, "the row must be cupy float32"
    row = cp.ascontiguousarray(row.reshape(-1))
    n = row.size
    assert fits(n, k), f"top_k of {k} from {n} values does not fit the kernels (top_k.fits)"
    tiles = -(-n // TOPK_TILE)
    cand = cp.empty(tiles * k, dtype=cp.uint64)
    finite = cp.empty(tiles, dtype=cp.int32)
    out = cp.empty(1 + 2 * k, dtype=cp.int32)
    module = load_module("top_k")
    module.get_function("top_k_tiles")((tiles,), (TOPK_THREADS,), (row, np.int32(n), np.int32(k), cand, finite))
    merge = module.get_function("top_k_merge")
    if merge.max_dynamic_shared_size_bytes < TOPK_CANDIDATES * 8:  # 64 KB: past the default 48
        merge.max_dynamic_shared_size_bytes = TOPK_CANDIDATES * 8
    merge((1,), (TOPK_THREADS,), (cand, finite, np.int32(tiles), np.int32(k), row, out),
          shared_mem=TOPK_CANDIDATES * 8)
    host = cp.asnumpy(out)
    if not host[0]:
        return None
    return host[1 : 1 + k].astype(np.int64), host[1 + k :].view(np.float32).copy()
