"""Equal-sized device-to-device runs by an offset table, in one launch of cuda/copy_runs.cu on the current
stream (the warm fill from staging copies a layer's warm experts into its cache slots with it)."""

from __future__ import annotations

from collections.abc import Sequence

import cupy as cp
import numpy as np

from runner.backends.cuda.kernels import load_module

THREADS = 256
MAX_BLOCKS_PER_RUN = 64  # a 2 MB run in 16-byte words is 8 passes of 64 x 256 threads
WORD_BYTES = (16, 4, 1)  # the widest that divides both bases, every offset and the run length


def word_bytes(dst_base: int, src_base: int, offsets: Sequence[int], nbytes: int) -> int:
    """The widest word of WORD_BYTES every address and the run length are a multiple of."""
    return next(w for w in WORD_BYTES if all(v % w == 0 for v in (dst_base, src_base, nbytes, *offsets)))


def copy_runs(dst_base: int, dst_offsets: Sequence[int], src_base: int, src_offsets: Sequence[int],
              nbytes: int) -> None:
    """dst_base + dst_offsets[r] <- src_base + src_offsets[r], nbytes each (byte offsets; runs must not overlap)."""
    assert len(dst_offsets) == len(src_offsets) and nbytes > 0
    if not dst_offsets:
        return
    w = word_bytes(dst_base, src_base, [*dst_offsets, *src_offsets], nbytes)
    words = nbytes // w
    src_off = cp.asarray(np.asarray(src_offsets, dtype=np.int64) // w)
    dst_off = cp.asarray(np.asarray(dst_offsets, dtype=np.int64) // w)
    blocks = min(MAX_BLOCKS_PER_RUN, -(-words // THREADS))
    load_module("copy_runs").get_function(f"copy_runs_{w}")(
        (blocks, len(dst_offsets)), (THREADS,),
        (np.uint64(src_base), np.uint64(dst_base), src_off, dst_off, np.int64(words)))
