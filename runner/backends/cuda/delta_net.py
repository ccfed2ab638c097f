"""CUDA twins of the hybrid families' ops in runner/backends/numpy/delta_net.py (cuda/delta_net.cu).

Each wrapper takes float32 C-contiguous CuPy arrays, checks them, and returns new arrays; none writes an
input (the sequence cache keeps states by reference) and none syncs with the host, so all can sit inside
a CUDA graph. The prompt path of the delta rule is the decode kernel over every token (one launch, a
sequential scan per state row), not yet the chunked form.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from runner.backends.cuda.kernels import load_module
from runner.backends.cuda.norm_rope import check_rope_input

ROW_THREADS = 256  # DN_ROW_THREADS in delta_net.cu
ELEMENTWISE_THREADS = 256
MAX_ELEMENTWISE_BLOCKS = 65536  # grid-stride loops cover the rest
DELTA_WARPS = 4  # DN_WARPS: state rows per block
NARROW_STATE_DIM = 128  # DN_NARROW_DIM: the largest state gated_delta_net_f32 takes (wider: the _wide_ kernel)
MAX_STATE_DIM = 256  # DN_MAX_DIM


def _kernel(name: str) -> cp.RawKernel:
    return load_module("delta_net").get_function(name)


def _check_f32(name: str, a: cp.ndarray, shape: tuple[int, ...] | None = None) -> None:
    assert isinstance(a, cp.ndarray), f"{name} must be a cupy array, got {type(a).__name__}"
    assert a.dtype == cp.float32, f"{name} must be float32, got {a.dtype}"
    assert a.flags.c_contiguous, f"{name} must be C-contiguous"
    assert shape is None or a.shape == shape, f"{name} has shape {a.shape}, expected {shape}"


def _grid(n: int) -> tuple[int]:
    return (max(1, min(MAX_ELEMENTWISE_BLOCKS, -(-n // ELEMENTWISE_THREADS))),)


def sigmoid(x: cp.ndarray) -> cp.ndarray:
    """1 / (1 + exp(-x)), elementwise."""
    _check_f32("x", x)
    out = cp.empty_like(x)
    if x.size:
        _kernel("sigmoid_f32")(_grid(x.size), (ELEMENTWISE_THREADS,), (x, out, np.int64(x.size)))
    return out


def l2_norm(x: cp.ndarray, eps: float) -> cp.ndarray:
    """x / sqrt(sum x^2 + eps) over the last axis (the twin's rms_norm form, mean in float64)."""
    _check_f32("x", x)
    n = x.shape[-1]
    out = cp.empty_like(x)
    rows = x.size // n if n else 0
    if rows:
        _kernel("l2_norm_f32")((rows,), (ROW_THREADS,), (x, out, np.int32(n), np.float64(eps)))
    return out


def rope_multi(x: cp.ndarray, positions: cp.ndarray, n_rot: int, base: float,
               sections: tuple[int, ...]) -> cp.ndarray:
    """x [tokens, heads, head_dim] NEOX-rotated on its first n_rot dims, each pair at its section's position
    (positions int32 [tokens]; pairs in the e section, or past t+h+w, stay put)."""
    _, heads, head_dim = check_rope_input(x, positions, n_rot)
    assert len(sections) == 4 and sum(sections) > 0, f"sections {sections} must be 4 counts, not all 0"
    out = cp.empty_like(x)
    if x.size:
        s_t, s_h, s_w, _ = (int(s) for s in sections)
        _kernel("rope_multi_f32")(
            _grid(x.size), (ELEMENTWISE_THREADS,),
            (x, positions, out, np.int64(x.size), np.int32(heads), np.int32(head_dim), np.int32(n_rot),
             np.float64(base), np.int32(s_t), np.int32(s_h), np.int32(s_w), np.int32(sum(sections))),
        )
    return out


def delta_net_gates(alpha: cp.ndarray, beta: cp.ndarray, dt_bias: cp.ndarray,
                    a: cp.ndarray) -> tuple[cp.ndarray, cp.ndarray]:
    """alpha, beta [T, H_v]; dt_bias, a [H_v] -> (g = softplus(alpha + dt_bias) * a, sigmoid(beta))."""
    _check_f32("alpha", alpha)
    assert alpha.ndim == 2, f"alpha must be [tokens, heads], got shape {alpha.shape}"
    heads = alpha.shape[1]
    _check_f32("beta", beta, alpha.shape)
    _check_f32("dt_bias", dt_bias, (heads,))
    _check_f32("a", a, (heads,))
    g, write = cp.empty_like(alpha), cp.empty_like(beta)
    if alpha.size:
        _kernel("delta_net_gates_f32")(_grid(alpha.size), (ELEMENTWISE_THREADS,),
                                       (alpha, beta, dt_bias, a, g, write, np.int64(alpha.size), np.int32(heads)))
    return g, write


def ssm_conv(x: cp.ndarray, state: cp.ndarray, w: cp.ndarray) -> tuple[cp.ndarray, cp.ndarray]:
    """SiLU of the causal depthwise conv (w [C, K]) of x [T, C] after state [K-1, C]; (y [T, C], the window
    [K-1+T, C]: the state followed by x)."""
    _check_f32("x", x)
    assert x.ndim == 2, f"x must be [tokens, channels], got shape {x.shape}"
    tokens, channels = x.shape
    _check_f32("w", w)
    assert w.ndim == 2 and w.shape[0] == channels and w.shape[1] >= 2, f"w {w.shape} must be [{channels}, K>=2]"
    kernel = w.shape[1]
    _check_f32("state", state, (kernel - 1, channels))
    y = cp.empty_like(x)
    window = cp.empty((kernel - 1 + tokens, channels), dtype=cp.float32)
    if window.size:
        _kernel("ssm_conv_f32")(_grid(window.size), (ELEMENTWISE_THREADS,),
                                (x, state, w, y, window, np.int32(tokens), np.int32(channels), np.int32(kernel)))
    return y, window


def gated_delta_net(q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, g: cp.ndarray, beta: cp.ndarray,
                    state: cp.ndarray, grouped: bool, keep_states: bool) -> tuple[cp.ndarray, cp.ndarray]:
    """The gated delta rule from state [H_v, S, S] (not written): (o [T, H_v, S], the state after every row
    [T, H_v, S, S] when keep_states, else after the last [1, H_v, S, S]). One launch for any T."""
    _check_f32("q", q)
    assert q.ndim == 3, f"q must be [tokens, key heads, dim], got shape {q.shape}"
    tokens, n_k_heads, dim = q.shape
    _check_f32("k", k, q.shape)
    _check_f32("v", v)
    assert v.ndim == 3 and v.shape[0] == tokens and v.shape[2] == dim, f"v {v.shape} must be [{tokens}, H_v, {dim}]"
    n_v_heads = v.shape[1]
    assert n_v_heads % n_k_heads == 0, f"{n_v_heads} value heads are not a multiple of {n_k_heads} key heads"
    assert 0 < dim <= MAX_STATE_DIM, f"state size {dim} must be in 1..{MAX_STATE_DIM}"
    _check_f32("g", g, (tokens, n_v_heads))
    _check_f32("beta", beta, (tokens, n_v_heads))
    _check_f32("state", state, (n_v_heads, dim, dim))
    out = cp.empty_like(v)
    states = cp.empty((tokens if keep_states else 1, n_v_heads, dim, dim), dtype=cp.float32)
    if tokens:
        _kernel("gated_delta_net_f32" if dim <= NARROW_STATE_DIM else "gated_delta_net_wide_f32")(
            (-(-dim // DELTA_WARPS), n_v_heads), (32 * DELTA_WARPS,),
            (q, k, v, g, beta, state, out, states, np.int32(tokens), np.int32(n_k_heads), np.int32(n_v_heads),
             np.int32(dim), np.int32(bool(grouped)), np.int32(bool(keep_states))),
        )
    else:
        states[...] = state
    return out, states


def row_dot(x: cp.ndarray, w: cp.ndarray) -> cp.ndarray:
    """x [T, n] times a 1-D weight w [n] -> [T] (each row's dot product summed in double)."""
    _check_f32("x", x)
    assert x.ndim == 2, f"x must be [rows, n], got shape {x.shape}"
    _check_f32("w", w, (x.shape[1],))
    out = cp.empty((x.shape[0],), dtype=cp.float32)
    if x.shape[0]:
        _kernel("row_dot_f32")((x.shape[0],), (ROW_THREADS,), (x, w, out, np.int32(x.shape[1])))
    return out
