"""CUDA twins of NumpyOps.route and of the per-token expert sum (cuda/route.cu; the selection is route.cuh's, which
gemv_cuda.gemv_norm_route also runs).

Pairs: p = t * k + j is token t's j-th selected expert; y [T * k, d] holds one output row per pair.
Launches per call: route 1; combine 1 (residual included). Neither syncs with the host, so both can
sit inside a CUDA graph.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from runner.backends.cuda.kernels import load_module
from runner.backends.cuda.launch import Kernel

MAX_EXPERTS = 512  # ROUTE_MAX_EXPERTS in route.cu
MAX_USED = 16  # ROUTE_MAX_USED
COMBINE_THREADS = 256


def _kernel(name: str) -> Kernel:
    return load_module("route").get_function(name)


def _check(name: str, a: cp.ndarray, dtype, ndim: int) -> None:
    assert isinstance(a, cp.ndarray), f"{name} must be a cupy array, got {type(a).__name__}"
    assert a.dtype == dtype, f"{name} must be {np.dtype(dtype).name}, got {a.dtype}"
    assert a.ndim == ndim, f"{name} must have {ndim} dims, got shape {a.shape}"
    assert a.flags.c_contiguous, f"{name} must be C-contiguous"


def selection_args(n_expert: int, probs_bias: cp.ndarray | None, gating: str, n_used: int, n_groups: int,
                   n_group_used: int, norm: bool, scale: float) -> tuple:
    """route.cuh's route_token arguments after the logits, checked: bias (or a null pointer), then n_used,
    sigmoid, n_groups, n_group_used, norm, use_scale and scale as the kernels take them."""
    assert gating in ("softmax", "sigmoid"), f"gating must be softmax or sigmoid, got {gating!r}"
    assert 0 < n_expert <= MAX_EXPERTS, f"{n_expert} experts: the route kernel takes 1..{MAX_EXPERTS}"
    assert 0 < n_used <= min(MAX_USED, n_expert), f"n_used {n_used} must be in 1..{min(MAX_USED, n_expert)}"
    if probs_bias is not None:
        _check("probs_bias", probs_bias, cp.float32, 1)
        assert probs_bias.shape == (n_expert,), f"probs_bias shape {probs_bias.shape} != ({n_expert},)"
    if n_groups > 1:
        assert n_expert % n_groups == 0 and 0 < n_group_used <= n_groups, (
            f"groups {n_groups}/{n_group_used} do not divide {n_expert} experts")
    return (probs_bias if probs_bias is not None else np.uint64(0), np.int32(n_used), np.int32(gating == "sigmoid"),
            np.int32(n_groups), np.int32(n_group_used), np.int32(bool(norm)), np.int32(scale not in (0.0, 1.0)),
            np.float32(scale))


def route(logits: cp.ndarray, probs_bias: cp.ndarray | None, gating: str, n_used: int, n_groups: int,
          n_group_used: int, norm: bool, scale: float) -> tuple[cp.ndarray, cp.ndarray]:
    """Each token's experts, ids int32 [T, k] best first (ties to the lower id), and weights f32 [T, k].

    logits f32 [T, E]; probs_bias f32 [E] or None; gating "softmax" or "sigmoid". One launch.
    """
    _check("logits", logits, cp.float32, 2)
    n_tok, n_expert = logits.shape
    bias, *selection = selection_args(n_expert, probs_bias, gating, n_used, n_groups, n_group_used, norm, scale)
    ids = cp.empty((n_tok, n_used), dtype=cp.int32)
    weights = cp.empty((n_tok, n_used), dtype=cp.float32)
    if n_tok:
        threads = max(64, -(-n_expert // 32) * 32)  # one thread per expert; >= 64 for the pairwise sum
        _kernel("route_f32")((n_tok,), (threads,), (logits, bias, np.int32(n_expert), *selection, ids, weights))
    return ids, weights


def combine(y: cp.ndarray, weights: cp.ndarray, out: cp.ndarray | None = None,
            residual: cp.ndarray | None = None, shared: bool = False) -> cp.ndarray:
    """out [T, d] = (residual +) (sum over j ascending of weights[t, j] * y[t * k + j] (+ y[T * k + t])), float32,
    one launch.

    With `shared`, y holds one more row per token after all the pairs (token t's at T * k + t: its shared
    expert), added unweighted once the sum is finished; the residual comes last. So combine(..., shared=True,
    residual=r) is bitwise r + (combine(y[:T * k], weights) + y[T * k:]). A token's result never depends on the
    other tokens.
    """
    _check("weights", weights, cp.float32, 2)
    _check("y", y, cp.float32, 2)
    n_tok, k = weights.shape
    d = y.shape[1]
    rows = n_tok * (k + 1) if shared else n_tok * k
    assert y.shape[0] == rows, f"y has {y.shape[0]} rows, weights {weights.shape} need {rows}"
    if out is None:
        out = cp.empty((n_tok, d), dtype=cp.float32)
    _check("out", out, cp.float32, 2)
    assert out.shape == (n_tok, d), f"out shape {out.shape} != {(n_tok, d)}"
    if residual is not None:
        _check("residual", residual, cp.float32, 2)
        assert residual.shape == (n_tok, d), f"residual shape {residual.shape} != {(n_tok, d)}"
    if n_tok and d:
        _kernel("combine_f32")(
            (-(-d // COMBINE_THREADS), n_tok), (COMBINE_THREADS,),
            (y, weights, residual if residual is not None else np.uint64(0), out, np.int32(k), np.int32(d),
             np.int32(shared)))
    return out
