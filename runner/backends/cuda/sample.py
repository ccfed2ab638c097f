"""Token selection on the GPU (cuda/sample.cu): greedy argmax, and the top-k candidates that
Sampler.choose_from turns into exactly the token Sampler would pick from the full logits.

Launches: greedy is one memset and one kernel; top_candidates is one kernel per round, each round
cutting n keys to ceil(n / 4096) * k (V = 151552: 2 rounds for k <= 110, 4 for k = 1024). Each
ends in one device-to-host copy, which waits for the GPU.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from runner.backends.cuda.kernels import load_module

ARGMAX_THREADS = 256
TOPK_THREADS = 1024
TOPK_SEGMENT = 4096  # TOPK_SEGMENT in sample.cu
MAX_CANDIDATES = 1024  # at most TOPK_SEGMENT / 4, so every round shrinks its input at least 4-fold
MAX_ARGMAX_BLOCKS = 264  # two per H200 SM: enough to stream the logits at full rate


def _kernel(name: str) -> cp.RawKernel:
    return load_module("sample").get_function(name)


def _check_logits(logits: cp.ndarray) -> int:
    assert isinstance(logits, cp.ndarray), f"logits must be a cupy array, got {type(logits).__name__}"
    assert logits.dtype == cp.float32 and logits.ndim == 1, f"logits must be f32 [V], got {logits.dtype} {logits.shape}"
    assert logits.flags.c_contiguous, "logits must be C-contiguous"
    assert 0 < logits.size < 2**31 - 1, f"vocabulary of {logits.size} logits"
    return int(logits.size)


def greedy(logits: cp.ndarray) -> int:
    """np.argmax(logits): the lowest index among the largest values (the first NaN if any)."""
    n = _check_logits(logits)
    best = cp.zeros(1, dtype=cp.uint64)
    blocks = min(MAX_ARGMAX_BLOCKS, -(-n // (4 * ARGMAX_THREADS)))
    _kernel("argmax_f32")((blocks,), (ARGMAX_THREADS,), (logits, np.int32(n), best))
    return 0xFFFFFFFF - (int(best.get()[0]) & 0xFFFFFFFF)


def top_candidates(logits: cp.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest logits, descending, ties to the lower id: ids int32 [k] and values f32 [k] on
    the host, equal to np.argsort(-logits, kind="stable")[:k] and the logits there."""
    n = _check_logits(logits)
    assert 0 < k <= min(MAX_CANDIDATES, n), f"k = {k} must be in 1..{min(MAX_CANDIDATES, n)}"
    result = cp.empty((2, k), dtype=cp.int32)  # ids, then the values' bits: one copy back
    null = np.uint64(0)
    keys: cp.ndarray | None = None
    while True:
        blocks = -(-n // TOPK_SEGMENT)
        seg = TOPK_SEGMENT if blocks > 1 else 1 << max(1, (n - 1).bit_length())
        keys_in = keys if keys is not None else null
        if blocks == 1:
            _kernel("topk_round")((1,), (TOPK_THREADS,), (logits, keys_in, np.int32(n), np.int32(seg),
                                                         np.int32(k), null, result[0], result[1]))
            break
        keys_out = cp.empty(blocks * k, dtype=cp.uint64)
        _kernel("topk_round")((blocks,), (TOPK_THREADS,), (logits, keys_in, np.int32(n), np.int32(seg),
                                                            np.int32(k), keys_out, null, null))
        keys, n = keys_out, blocks * k
    host = result.get()
    return host[0].copy(), host[1].view(np.float32).copy()
