"""CUDA twins of the hybrid families' ops in runner/backends/numpy/delta_net.py (cuda/delta_net.cu).

Each wrapper takes float32 C-contiguous CuPy arrays, checks them, and returns new arrays; none writes an
input (the sequence cache keeps states by reference) and none syncs with the host, so all can sit inside
a CUDA graph. The delta rule runs as a sequential scan per state row for decode, verify (every row's state) and
short prompts, and in chunks on tensor cores (cuda/delta_net_chunked.cu) for longer prompts.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from runner.backends.cuda.kernels import load_module
from runner.backends.cuda.launch import Kernel
from runner.backends.cuda.norm_rope import check_rope_input
from runner.backends.limits import DELTA_RULE_CHUNK

ROW_THREADS = 256  # DN_ROW_THREADS in delta_net.cu
ELEMENTWISE_THREADS = 256
MAX_ELEMENTWISE_BLOCKS = 65536  # grid-stride loops cover the rest
DELTA_WARPS = 4  # DN_WARPS: state rows per block
NARROW_STATE_DIM = 128  # DN_NARROW_DIM: the largest state gated_delta_net_f32 takes (wider: the _wide_ kernel)
MAX_STATE_DIM = 256  # DN_MAX_DIM
CHUNK_TOKENS = DELTA_RULE_CHUNK  # DNC_CHUNK in delta_net_chunked.cu
CHUNKED_MAX_DIM = 128  # DNC_DIM: the chunked kernels take state sizes that are multiples of 8 up to this
CHUNK_SLAB_ROWS = 16  # DNC_SLAB: state rows per block of the chunked state kernel
CHUNK_PREP_THREADS = 256  # DNC_PREP_THREADS
CHUNK_STATE_THREADS = 128  # DNC_STATE_THREADS
# Prompts of at least this many tokens take the chunked kernels: below it they would still pay a whole chunk
# (64 x 64 products, a 64-row triangular solve, two launches, scratch) for a few tokens, while the scan's
# time grows with the token count. Half a chunk: an estimate until bench_delta_net_cuda measures the crossing.
CHUNKED_MIN_TOKENS = 32


def _kernel(name: str, module: str = "delta_net") -> Kernel:
    return load_module(module).get_function(name)


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


def _check_delta_rule(q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, g: cp.ndarray, beta: cp.ndarray,
                      state: cp.ndarray) -> tuple[int, int, int, int]:
    """(tokens, key heads, value heads, state size) of the delta rule's inputs, checked."""
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
    return tokens, n_k_heads, n_v_heads, dim


def chunked_fits(dim: int) -> bool:
    """Whether the chunked kernels take state size `dim` (wider or odd sizes keep the scan)."""
    return dim % 8 == 0 and 0 < dim <= CHUNKED_MAX_DIM


def gated_delta_net(q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, g: cp.ndarray, beta: cp.ndarray,
                    state: cp.ndarray, grouped: bool, keep_states: bool,
                    tensor_cores: bool = True) -> tuple[cp.ndarray, cp.ndarray]:
    """The gated delta rule from state [H_v, S, S] (not written): (o [T, H_v, S], the state after every row
    [T, H_v, S, S] when keep_states, else after the last [1, H_v, S, S]). A prompt of CHUNKED_MIN_TOKENS or
    more without keep_states goes in chunks on tensor cores when `tensor_cores` and the size fits
    (gated_delta_net_chunked); anything else is the scan, one launch for any T."""
    tokens, n_k_heads, n_v_heads, dim = _check_delta_rule(q, k, v, g, beta, state)
    if tensor_cores and not keep_states and tokens >= CHUNKED_MIN_TOKENS and chunked_fits(dim):
        return gated_delta_net_chunked(q, k, v, g, beta, state, grouped)
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


def gated_delta_net_chunked(q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, g: cp.ndarray, beta: cp.ndarray,
                            state: cp.ndarray, grouped: bool) -> tuple[cp.ndarray, cp.ndarray]:
    """The delta rule in chunks of CHUNK_TOKENS on tensor cores (tf32 operands, float32 accumulation and
    state; the twin of numpy's gated_delta_net_chunked): (o [T, H_v, S], the state after the last token
    [1, H_v, S, S]), for S a multiple of 8 up to CHUNKED_MAX_DIM. Two launches and (2 S + 65) floats of
    scratch per value head and padded token."""
    tokens, n_k_heads, n_v_heads, dim = _check_delta_rule(q, k, v, g, beta, state)
    assert chunked_fits(dim), f"the chunked kernels take state sizes that are multiples of 8 up to " \
                              f"{CHUNKED_MAX_DIM}, not {dim}"
    out = cp.empty_like(v)
    states = cp.empty((1, n_v_heads, dim, dim), dtype=cp.float32)
    if not tokens:
        states[...] = state
        return out, states
    chunks = -(-tokens // CHUNK_TOKENS)
    u = cp.empty((n_v_heads, chunks, CHUNK_TOKENS, dim), dtype=cp.float32)  # (I + A)^-1 beta v
    w = cp.empty_like(u)  # (I + A)^-1 beta k exp(G)
    p = cp.empty((n_v_heads, chunks, CHUNK_TOKENS, CHUNK_TOKENS), dtype=cp.float32)  # q k^T * D / sqrt(S)
    g_cum = cp.empty((n_v_heads, chunks, CHUNK_TOKENS), dtype=cp.float32)  # G
    sizes = (np.int32(tokens), np.int32(n_k_heads), np.int32(n_v_heads), np.int32(dim), np.int32(bool(grouped)))
    _kernel("gated_delta_net_chunk_prep_f32", "delta_net_chunked")(
        (chunks, n_v_heads), (CHUNK_PREP_THREADS,), (q, k, v, g, beta, u, w, p, g_cum, *sizes))
    _kernel("gated_delta_net_chunk_state_f32", "delta_net_chunked")(
        (-(-dim // CHUNK_SLAB_ROWS), n_v_heads), (CHUNK_STATE_THREADS,),
        (q, k, u, w, p, g_cum, state, out, states, *sizes))
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
