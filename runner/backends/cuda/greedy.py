"""CUDA twin of NumpyOps.greedy_token (cuda/greedy.cu): a logits row's argmax and finiteness on the device."""

from __future__ import annotations

import cupy as cp
import numpy as np

from runner.backends.cuda.kernels import load_module

GREEDY_THREADS = 1024  # matches greedy.cu


def greedy_token(logits: cp.ndarray) -> int | None:
    """The index of the largest of `logits` (float32, one row; the first of equals), or None when any value is
    NaN or infinite. One launch and an 8-byte download (the row stays on the device)."""
    assert isinstance(logits, cp.ndarray) and logits.dtype == cp.float32, "logits must be cupy float32"
    row = cp.ascontiguousarray(logits.reshape(-1))
    assert 0 < row.size < 2**31, f"a logits row of {row.size} values"
    out = cp.empty(2, dtype=cp.int32)
    launch_greedy(row, out)
    index, finite = (int(v) for v in cp.asnumpy(out))
    return index if finite else None


def greedy_rows(logits: cp.ndarray) -> list[int | None]:
    """greedy_token of each row of logits [R, vocab] (a verify batch's): a launch a row, one download of 2 R ints."""
    assert isinstance(logits, cp.ndarray) and logits.dtype == cp.float32 and logits.ndim == 2, (
        "logits must be cupy float32 [rows, vocab]")
    assert 0 < logits.shape[1] < 2**31, f"logits rows of {logits.shape[1]} values"
    out = cp.empty((logits.shape[0], 2), dtype=cp.int32)
    for r in range(logits.shape[0]):
        launch_greedy(cp.ascontiguousarray(logits[r]), out[r])
    return [int(index) if finite else None for index, finite in cp.asnumpy(out)]


def launch_greedy(row: cp.ndarray, out: cp.ndarray, token_out: cp.ndarray | None = None) -> None:
    """Enqueue greedy_f32 on the current stream: out int32 [2] = (argmax, finite) of the float32 row, and the
    argmax also into token_out (int64 [1], a decode graph's token buffer) when given. Nothing waits."""
    assert row.dtype == cp.float32 and row.ndim == 1 and row.flags.c_contiguous, "row must be contiguous float32"
    assert out.dtype == cp.int32 and out.size >= 2 and out.flags.c_contiguous, "out must be contiguous int32 [2]"
    assert token_out is None or (token_out.dtype == cp.int64 and token_out.size >= 1), "token_out must be int64"
    load_module("greedy").get_function("greedy_f32")(
        (1,), (GREEDY_THREADS,), (row, np.int32(row.size), out, token_out if token_out is not None else np.uint64(0)))
