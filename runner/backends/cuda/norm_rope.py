"""CUDA twins of NumpyOps.rms_norm, rope_neox and swiglu, plus the residual add (cuda/norm_rope.cu).

Each wrapper takes float32 C-contiguous CuPy arrays, checks them, and returns a new array.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from runner.backends.cuda.kernels import load_module
from runner.backends.cuda.launch import Kernel

RMS_NORM_THREADS = 256  # matches RMS_NORM_THREADS in norm_rope.cu
ELEMENTWISE_THREADS = 256
MAX_ELEMENTWISE_BLOCKS = 65536  # grid-stride loops cover the rest


def _kernel(name: str) -> Kernel:
    return load_module("norm_rope").get_function(name)


def _check_f32(name: str, a: cp.ndarray) -> None:
    assert isinstance(a, cp.ndarray), f"{name} must be a cupy array, got {type(a).__name__}"
    assert a.dtype == cp.float32, f"{name} must be float32, got {a.dtype}"
    assert a.flags.c_contiguous, f"{name} must be C-contiguous"


def _elementwise_grid(n: int) -> tuple[int]:
    return (max(1, min(MAX_ELEMENTWISE_BLOCKS, -(-n // ELEMENTWISE_THREADS))),)


def rms_norm(x: cp.ndarray, w: cp.ndarray, eps: float) -> cp.ndarray:
    """x [..., n] scaled by 1/sqrt(mean(x^2) + eps) (mean in float64) and by the weight w [n]."""
    _check_f32("x", x)
    _check_f32("w", w)
    n = x.shape[-1]
    assert x.ndim >= 1 and w.shape == (n,), f"weight shape {w.shape} does not match x's last dim {n}"
    out = cp.empty_like(x)
    rows = x.size // n if n else 0
    if rows:
        _kernel("rms_norm_f32")((rows,), (RMS_NORM_THREADS,), (x, w, out, np.int32(n), np.float64(eps)))
    return out


def check_rope_input(x: cp.ndarray, positions: cp.ndarray, n_rot: int) -> tuple[int, int, int]:
    """x float32 [tokens, heads, head_dim], positions int32 [tokens], n_rot even up to head_dim: x's shape."""
    _check_f32("x", x)
    assert x.ndim == 3, f"x must be [tokens, heads, head_dim], got shape {x.shape}"
    tokens, heads, head_dim = x.shape
    assert isinstance(positions, cp.ndarray) and positions.dtype == cp.int32, "positions must be cupy int32"
    assert positions.shape == (tokens,) and positions.flags.c_contiguous, (
        f"positions shape {positions.shape} must be ({tokens},) and contiguous"
    )
    assert n_rot % 2 == 0 and 0 <= n_rot <= head_dim, f"n_rot {n_rot} must be even and <= head_dim {head_dim}"
    return tokens, heads, head_dim


def rope_neox(x: cp.ndarray, positions: cp.ndarray, n_rot: int, base: float) -> cp.ndarray:
    """x [tokens, heads, head_dim] with the first n_rot dims of each head rotated by positions [tokens]."""
    _, heads, head_dim = check_rope_input(x, positions, n_rot)
    out = cp.empty_like(x)
    if x.size:
        _kernel("rope_neox_f32")(
            _elementwise_grid(x.size),
            (ELEMENTWISE_THREADS,),
            (x, positions, out, np.int64(x.size), np.int32(heads), np.int32(head_dim), np.int32(n_rot),
             np.float64(base)),
        )
    return out


def rope_store(q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, k_buf: cp.ndarray, v_buf: cp.ndarray,
               positions: cp.ndarray, n_rot: int, base: float) -> cp.ndarray:
    """rope_neox(q, ...) returned, rope_neox(k, ...) and v written at rows `positions` of k_buf and v_buf
    ([S, kv heads, head_dim], float32 or float16, rounded to nearest even): one launch for the three ops."""
    tokens, hq, head_dim = check_rope_input(q, positions, n_rot)
    for name, a in (("k", k), ("v", v)):
        _check_f32(name, a)
        assert a.ndim == 3 and a.shape[0] == tokens and a.shape[2] == head_dim, f"{name} shape {a.shape} vs q {q.shape}"
    hk = k.shape[1]
    assert v.shape == k.shape, f"v shape {v.shape} != k shape {k.shape}"
    assert k_buf.dtype == v_buf.dtype and k_buf.dtype in (cp.float32, cp.float16), "K/V buffers: float32 or float16"
    for name, buf in (("k_buf", k_buf), ("v_buf", v_buf)):
        assert buf.ndim == 3 and buf.shape[1:] == (hk, head_dim) and buf.flags.c_contiguous, (
            f"{name} must be C-contiguous [S, {hk}, {head_dim}], got {buf.shape}")
    q_out = cp.empty_like(q)
    total = tokens * (hq + 2 * hk) * head_dim
    if total:
        suffix = "f16" if k_buf.dtype == cp.float16 else "f32"
        _kernel(f"rope_store_{suffix}")(
            _elementwise_grid(total), (ELEMENTWISE_THREADS,),
            (q, k, v, positions, q_out, k_buf, v_buf, np.int64(total), np.int32(hq), np.int32(hk), np.int32(head_dim),
             np.int32(n_rot), np.float64(base)))
    return q_out


def _binary(kernel_name: str, a_name: str, a: cp.ndarray, b_name: str, b: cp.ndarray) -> cp.ndarray:
    _check_f32(a_name, a)
    _check_f32(b_name, b)
    assert a.shape == b.shape, f"{a_name} {a.shape} and {b_name} {b.shape} differ in shape"
    out = cp.empty_like(a)
    if a.size:
        _kernel(kernel_name)(_elementwise_grid(a.size), (ELEMENTWISE_THREADS,), (a, b, out, np.int64(a.size)))
    return out


def swiglu(gate: cp.ndarray, up: cp.ndarray) -> cp.ndarray:
    """silu(gate) * up, elementwise, computed as gate / (1 + exp(-gate)) * up like the twin."""
    return _binary("swiglu_f32", "gate", gate, "up", up)


def add(a: cp.ndarray, b: cp.ndarray) -> cp.ndarray:
    """a + b, elementwise: the residual add."""
    return _binary("add_f32", "a", a, "b", b)
