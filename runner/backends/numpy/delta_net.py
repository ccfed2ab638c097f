"""Gated DeltaNet and the hybrid families' other new math, on numpy float32: the reference the CUDA
kernels are checked against (NumpyOps's hybrid methods call these).

Layouts: activations are [T, heads, head_dim]; a recurrent state is [H_v, S, S] indexed [head, value
j, key i] (llama.cpp's memory order, so a kernel can share its tests' data); a conv state holds the
last K-1 inputs [K-1, C] of a sequence, oldest first.
"""

from __future__ import annotations

import numpy as np

Array = np.ndarray


def sigmoid(x: Array) -> Array:
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32, copy=False)


def softplus(x: Array) -> Array:
    """log(1 + e^x), taken as x past 20 as ggml does."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0)))).astype(np.float32, copy=False)


def l2_norm(x: Array, eps: float) -> Array:
    """x / sqrt(sum x^2 + eps) over the last axis (llama.cpp: rms_norm with eps/n, scaled by 1/sqrt(n))."""
    n = x.shape[-1]
    mean_sq = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
    return x * (1.0 / np.sqrt(mean_sq + eps / n)).astype(np.float32) * np.float32(1.0 / np.sqrt(n))


def ssm_conv(x: Array, state: Array, w: Array) -> tuple[Array, Array]:
    """Causal depthwise conv of x [T, C] after the K-1 inputs in `state`, then SiLU.

    w [C, K] is the file's ssm_conv1d; output row t sums window[t + k] * w[:, k] over k in order, as
    ggml_ssm_conv does. Returns (SiLU(conv) [T, C], window [K-1+T, C]): the window's last K-1 rows are
    the next state, and rows i+1..i+K-1 the state after row i (what a rollback into the batch needs).
    """
    n_tok, kernel = x.shape[0], w.shape[1]
    window = np.concatenate([state, x], axis=0)
    y = np.zeros_like(x)
    for k in range(kernel):
        y += window[k : k + n_tok] * w[:, k]
    return y / (1.0 + np.exp(-y)), window


def delta_net_gates(alpha: Array, beta: Array, dt_bias: Array, a: Array) -> tuple[Array, Array]:
    """Per token and value head: the log decay g = softplus(alpha + dt_bias) * a (a = -exp(A_log), as the
    file stores it) and the write strength sigmoid(beta); both [T, H_v]."""
    return softplus(alpha + dt_bias) * a, sigmoid(beta)


def key_head_of(n_v_heads: int, n_k_heads: int, grouped: bool) -> np.ndarray:
    """The key head each value head reads: h div (H_v/H_k) in grouped order, h mod H_k in tiled order."""
    heads = np.arange(n_v_heads)
    return heads // (n_v_heads // n_k_heads) if grouped else heads % n_k_heads


def gated_delta_net(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array, grouped: bool,
                    keep_states: bool) -> tuple[Array, Array]:
    """The gated delta rule, token by token: per value head h with its key head's q, k (L2-normed),

        S <- exp(g) S;   S <- S + beta (v - S k) k^T;   o = S q / sqrt(S_k)

    q, k [T, H_k, S], v [T, H_v, S], g and beta [T, H_v], state [H_v, S, S] (not modified).
    Returns (o [T, H_v, S], states): the state after every row [T, H_v, S, S] when `keep_states`, else
    after the last row only [1, H_v, S, S]. Each row is computed alone, so a row's bits do not depend
    on the batch it came in (speculative verify stays lossless).
    """
    n_tok, n_k_heads, dim = q.shape
    n_v_heads = v.shape[1]
    heads = key_head_of(n_v_heads, n_k_heads, grouped)
    qh, kh = q[:, heads], k[:, heads]  # [T, H_v, S]
    scale = np.float32(1.0 / np.sqrt(dim))
    s = state.copy()
    out = np.empty_like(v)
    states = np.empty((n_tok if keep_states else 1, n_v_heads, dim, dim), dtype=np.float32)
    for t in range(n_tok):
        s *= np.exp(g[t])[:, None, None]
        sk = np.matmul(s, kh[t][:, :, None])[:, :, 0]  # [H_v, S]: S k
        delta = (v[t] - sk) * beta[t][:, None]
        s += delta[:, :, None] * kh[t][:, None, :]
        out[t] = np.matmul(s, qh[t][:, :, None])[:, :, 0] * scale
        if keep_states:
            states[t] = s
    if not keep_states:
        states[0] = s
    return out, states


def gated_delta_net_chunked(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array, grouped: bool,
                            chunk: int = 64) -> tuple[Array, Array]:
    """The same rule as gated_delta_net, in chunks of `chunk` tokens (the parallel form a GPU prompt path
    uses; llama.cpp's build_delta_net_chunking computes the same): within a chunk every product is a
    matrix product, and only the state passes from chunk to chunk.

    Per value head, with G the running sum of g inside the chunk, D[i, j] = exp(G_i - G_j) for j <= i:
    T = (I + strict_lower((beta k) k^T * D))^-1, U = T (beta v), W = T (beta k exp(G));
    new values V' = U - W S^T; o = (q exp(G)) S^T + ((q k^T) * D) V';
    S <- exp(G_last) S + V'^T (k exp(G_last - G)). Every exponent is <= 0 (g <= 0), so nothing overflows.
    Returns (o [T, H_v, S], the final state [1, H_v, S, S]).
    """
    n_tok, n_k_heads, dim = q.shape
    heads = key_head_of(v.shape[1], n_k_heads, grouped)
    qh = q[:, heads].transpose(1, 0, 2) * np.float32(1.0 / np.sqrt(dim))  # [H_v, T, S]
    kh, vh = k[:, heads].transpose(1, 0, 2), v.transpose(1, 0, 2)
    gh, bh = g.T, beta.T  # [H_v, T]
    s = state.copy()
    out = np.empty_like(vh)
    for start in range(0, n_tok, chunk):
        c = slice(start, start + chunk)
        qc, kc, vc, bc = qh[:, c], kh[:, c], vh[:, c], bh[:, c, None]
        cum = np.cumsum(gh[:, c], axis=1)  # [H_v, n]
        n = cum.shape[1]
        lower = np.tril(np.ones((n, n), dtype=bool))
        decay = np.exp(np.where(lower, cum[:, :, None] - cum[:, None, :], -np.inf)).astype(np.float32)
        strict = np.where(np.eye(n, dtype=bool), 0.0, (kc * bc) @ kc.transpose(0, 2, 1) * decay)
        solve = np.linalg.inv(np.eye(n, dtype=np.float32) + strict.astype(np.float32))  # unit lower triangular
        u = solve @ (vc * bc)
        w = solve @ (kc * bc * np.exp(cum)[:, :, None])
        v_new = u - w @ s.transpose(0, 2, 1)  # [H_v, n, S]
        inter = (qc * np.exp(cum)[:, :, None]) @ s.transpose(0, 2, 1)  # what the state before the chunk gives
        out[:, c] = inter + ((qc @ kc.transpose(0, 2, 1)) * decay) @ v_new
        to_end = np.exp(cum[:, -1:] - cum)[:, :, None]  # [H_v, n, 1]
        s = s * np.exp(cum[:, -1])[:, None, None] + v_new.transpose(0, 2, 1) @ (kc * to_end)
    return out.transpose(1, 0, 2), s[None].astype(np.float32)


def rope_section_positions(positions: np.ndarray, n_rot: int, sections: tuple[int, ...]) -> np.ndarray:
    """Per rotary pair, the position a text token rotates by under llama.cpp's interleaved multi-section
    rotary (IMROPE): pairs cycle through the sections t, h, w (every one the token's position) and e
    (position 0, no rotation). [T, n_rot/2]."""
    n_pairs = n_rot // 2
    sector = np.arange(n_pairs) % sum(sections)
    s_t, s_h, s_w = sections[0], sections[1], sections[2]
    text = (
        ((sector % 3 == 0) & (sector < 3 * s_t))
        | ((sector % 3 == 1) & (sector < 3 * s_h))
        | ((sector % 3 == 2) & (sector < 3 * s_w))
    )
    return positions.astype(np.float64)[:, None] * text[None, :]


def rope_multi(x: Array, positions: np.ndarray, n_rot: int, base: float, sections: tuple[int, ...]) -> Array:
    """NEOX-paired rotary of the first n_rot dims of each head of x [T, H, D], each pair at its section's
    position (rope_section_positions)."""
    half = n_rot // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    theta = rope_section_positions(positions, n_rot, sections) * inv_freq[None, :]  # [T, half]
    cos = np.cos(theta).astype(np.float32)[:, None, :]
    sin = np.sin(theta).astype(np.float32)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:n_rot]
    out = x.copy()
    out[..., :half] = x0 * cos - x1 * sin
    out[..., half:n_rot] = x0 * sin + x1 * cos
    return out
