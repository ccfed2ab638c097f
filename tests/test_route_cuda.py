"""Router top-k and combine (cuda/route.cu) against NumpyOps.route / NumpyOps.moe.

Tolerances, and why:
- route ids: exact, same order (selection descending, ties to the lower expert), ties included.
- route weights, rtol 1e-6: sigmoid and softmax go through CUDA's expf and numpy's float32 exp,
  each within about 2 ulp of exact; every other step is the twin's (the softmax sum and the
  renormalising sum in numpy's pairwise order, IEEE division, unfused multiplies), so a weight
  sits a few ulp (a few 1e-7 relative) from the twin's.
- combine: bit-exact against numpy doing the same float32 multiply-adds in j order; batch
  invariance bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from runner.backends.cuda.kernels import gpu_available
from runner.backends.numpy.ops import NumpyOps
from runner.gguf_file import TensorInfo
from runner.models.config import ModelConfig

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda import route as route_cuda  # noqa: E402


def config(n_expert: int, k: int, gating: str, groups: int = 0, group_used: int = 0, norm: bool = True,
           scale: float = 0.0) -> ModelConfig:
    return ModelConfig(arch="glm4moe", n_vocab=16, n_embd=8, n_layer=1, n_nextn=0, n_head=1, n_head_kv=1,
                       head_dim=8, n_rot=8, rope_base=1e4, rms_eps=1e-6, n_ctx_train=64, n_ff=8,
                       n_expert=n_expert, n_expert_used=k, n_ff_exp=8, n_expert_shared=0, n_dense_lead=0,
                       gating=gating, expert_weights_norm=norm, expert_weights_scale=scale,
                       n_expert_groups=groups, n_group_used=group_used)


def vector(v: np.ndarray) -> TensorInfo:
    return TensorInfo(name="exp_probs_b", qtype=GGMLQuantizationType.F32, shape=v.shape, data=v, offset=0)


def router_logits(rng: np.random.Generator, n_tok: int, n_expert: int, ties: bool) -> np.ndarray:
    x = rng.standard_normal((n_tok, n_expert)) * 2
    if ties:  # a coarse grid: many experts share a logit, so many selections tie exactly
        x = np.round(x * 2) / 2
    return x.astype(np.float32)


def check_route(logits: np.ndarray, bias: np.ndarray | None, cfg: ModelConfig) -> None:
    want_ids, want_w = NumpyOps().route(logits, vector(bias) if bias is not None else None, cfg)
    ids, w = route_cuda.route(cp.asarray(logits), cp.asarray(bias) if bias is not None else None, cfg.gating,
                            cfg.n_expert_used, cfg.n_expert_groups, cfg.n_group_used, cfg.expert_weights_norm,
                            cfg.expert_weights_scale)
    assert ids.dtype == cp.int32 and w.dtype == cp.float32 and ids.shape == w.shape == want_ids.shape
    np.testing.assert_array_equal(cp.asnumpy(ids), want_ids)
    np.testing.assert_allclose(cp.asnumpy(w), want_w, rtol=1e-6, atol=0)


@pytest.mark.parametrize("n_tok", [1, 7, 300])
@pytest.mark.parametrize("n_expert,k", [(8, 2), (8, 8), (128, 2), (128, 8), (128, 10), (512, 8), (512, 10),
                                        (160, 8), (100, 16)])
@pytest.mark.parametrize("gating", ["softmax", "sigmoid"])
def test_route_matches_numpy_twin(n_tok: int, n_expert: int, k: int, gating: str) -> None:
    rng = np.random.default_rng(n_tok * 1000 + n_expert * 10 + k)
    for ties in (False, True):
        logits = router_logits(rng, n_tok, n_expert, ties)
        bias = (np.round(rng.standard_normal(n_expert) * 4) / 8).astype(np.float32)  # grid: ties survive
        for b in (None, bias):
            for norm, scale in ((False, 0.0), (True, 0.0), (True, 1.0), (True, 2.5), (False, 16.0)):
                check_route(logits, b, config(n_expert, k, gating, norm=norm, scale=scale))


@pytest.mark.parametrize("n_tok", [1, 7, 300])
@pytest.mark.parametrize("n_expert,k,groups,used", [(128, 8, 8, 3), (256, 8, 8, 4), (512, 10, 8, 4),
                                                    (512, 16, 64, 5), (8, 2, 8, 4), (8, 3, 4, 1), (64, 10, 2, 1)])
def test_route_with_expert_groups_matches_numpy_twin(n_tok: int, n_expert: int, k: int, groups: int,
                                                     used: int) -> None:
    # (8, 3, 4, 1): one group of two experts kept for k = 3, so a masked (-inf) expert is picked too.
    rng = np.random.default_rng(n_tok + n_expert + groups)
    for ties in (False, True):
        logits = router_logits(rng, n_tok, n_expert, ties)
        bias = (rng.standard_normal(n_expert) * 0.1).astype(np.float32)
        for gating in ("sigmoid", "softmax"):
            for b in (None, bias):
                check_route(logits, b, config(n_expert, k, gating, groups, used, norm=True, scale=2.5))


def test_route_all_equal_logits_picks_the_lowest_ids() -> None:
    logits = np.zeros((3, 128), dtype=np.float32)
    ids, w = route_cuda.route(cp.asarray(logits), None, "softmax", 8, 0, 0, True, 0.0)
    assert cp.asnumpy(ids).tolist() == [list(range(8))] * 3
    np.testing.assert_array_equal(cp.asnumpy(w), np.full((3, 8), 0.125, dtype=np.float32))


def combine_in_j_order(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    n_tok, k = w.shape
    ys = y.reshape(n_tok, k, -1)
    acc = np.zeros((n_tok, ys.shape[2]), dtype=np.float32)
    for j in range(k):
        acc = acc + w[:, j, None] * ys[:, j]
    return acc


# k 16 and under: every operand loaded before the adds (route.cuh COMBINE_AHEAD); 20: the loop past it
@pytest.mark.parametrize("n_tok,k,d", [(1, 8, 4096), (4, 10, 2048), (7, 2, 300), (300, 8, 1024), (2, 16, 5),
                                       (3, 20, 300)])
def test_combine_is_exact_in_j_order_and_batch_invariant(n_tok: int, k: int, d: int) -> None:
    rng = np.random.default_rng(n_tok * k + d)
    y = rng.standard_normal((n_tok * k, d)).astype(np.float32)
    w = rng.random((n_tok, k)).astype(np.float32)
    residual = rng.standard_normal((n_tok, d)).astype(np.float32)
    got = cp.asnumpy(route_cuda.combine(cp.asarray(y), cp.asarray(w)))
    want = combine_in_j_order(y, w)
    np.testing.assert_array_equal(got, want)
    with_res = cp.asnumpy(route_cuda.combine(cp.asarray(y), cp.asarray(w), residual=cp.asarray(residual)))
    np.testing.assert_array_equal(with_res, residual + want)
    out = cp.full((n_tok, d), np.nan, dtype=cp.float32)
    assert route_cuda.combine(cp.asarray(y), cp.asarray(w), out=out) is out
    np.testing.assert_array_equal(cp.asnumpy(out), want)
    for t in {0, n_tok // 2, n_tok - 1}:  # a token alone gives the same bits as inside the batch
        alone = route_cuda.combine(cp.asarray(y[t * k : (t + 1) * k]), cp.asarray(w[t : t + 1]))
        np.testing.assert_array_equal(cp.asnumpy(alone)[0], got[t])
    # the shared expert's rows after the pairs: added once the sum is done, before the residual
    shared = rng.standard_normal((n_tok, d)).astype(np.float32)
    both = cp.asnumpy(route_cuda.combine(cp.asarray(np.concatenate([y, shared])), cp.asarray(w), shared=True,
                                         residual=cp.asarray(residual)))
    np.testing.assert_array_equal(both, residual + (want + shared))
    with pytest.raises(AssertionError, match="rows"):
        route_cuda.combine(cp.asarray(y), cp.asarray(w), shared=True)
