"""The prompt expert path (cuda/moe_prefill.cu: grouped tensor-core GEMMs) against a float64 numpy twin.

Tolerance: activations, weights and the SwiGLU output are rounded to fp16 (relative 4.9e-4 each)
before float32-accumulated products, so each expert's output may move by about 3e-3 of the magnitude
of its terms: |out - ref| <= sum_j |w_j| (3e-3 (|h_j| @ |W_down|^T) + 1e-6) is asserted per token.
Row invariance is asserted bit for bit: a token's output does not depend on the other tokens of
the call nor on how many experts a chunk holds.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda.device_weights import DeviceTensor  # noqa: E402
from runner.backends.cuda import moe_prefill as moe_prefill_module  # noqa: E402
from runner.backends.cuda.moe_prefill import ExpertMatrixSet, group_by_expert, moe_prefill, pair_tiles  # noqa: E402
from runner.synth.random_blocks import random_tensor  # noqa: E402


def expert_tensor(rng, name: str, qtype: QT, n_expert: int, rows: int, cols: int):
    data = random_tensor(rng, qtype, (n_expert, rows, cols), std=0.05)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(n_expert * rows, -1)
    dense = dequantize(data, qtype).astype(np.float64).reshape(n_expert, rows, cols)
    return DeviceTensor(name, qtype, (n_expert, rows, cols), cp.asarray(raw)), dense


_KEEP_ALIVE: list = []


def _case(rng, qtype: QT, n_tok: int, n_expert: int, k: int, d: int = 256, f: int = 512):
    gate, g = expert_tensor(rng, "gate", qtype, n_expert, f, d)
    up, u = expert_tensor(rng, "up", qtype, n_expert, f, d)
    down, dn = expert_tensor(rng, "down", qtype, n_expert, d, f)
    x = rng.standard_normal((n_tok, d)).astype(np.float32)
    ids = np.stack([rng.choice(n_expert, size=k, replace=False) for _ in range(n_tok)]).astype(np.int32)
    w = rng.random((n_tok, k)).astype(np.float32)
    _KEEP_ALIVE[:] = [gate, up, down]  # the sets hold bare device addresses into these tensors
    sets = [ExpertMatrixSet.resident(t) for t in (gate, up, down)]
    return x, ids, w, sets, (g, u, dn)


def _check_against_numpy(got, x, ids, w, dense) -> None:
    g, u, dn = dense
    for t in range(len(x)):
        want, bound = np.zeros(dn.shape[1]), np.full(dn.shape[1], 1e-6 * ids.shape[1])
        for e, wt in zip(ids[t], w[t]):
            gv, uv = g[e] @ x[t], u[e] @ x[t]
            h = gv / (1 + np.exp(-gv)) * uv
            want += wt * (dn[e] @ h)
            bound += wt * 3e-3 * (np.abs(dn[e]) @ np.abs(h))
        assert np.all(np.abs(got[t] - want) <= bound), f"token {t}"


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q8_0, QT.F16, QT.Q6_K])
@pytest.mark.parametrize("n_tok,n_expert,k", [(9, 8, 2), (300, 16, 4), (64, 128, 8), (700, 8, 3)])
def test_grouped_prefill_experts_match_numpy(qtype: QT, n_tok: int, n_expert: int, k: int) -> None:
    rng = np.random.default_rng(n_tok + n_expert)
    x, ids, w, sets, dense = _case(rng, qtype, n_tok, n_expert, k)
    got = cp.asnumpy(moe_prefill(cp.asarray(x), cp.asarray(ids), cp.asarray(w), *sets))
    _check_against_numpy(got, x, ids, w, dense)


@pytest.mark.parametrize("qtype", [QT.Q5_0, QT.Q8_0, QT.IQ4_NL, QT.Q4_0])
def test_row_widths_that_are_not_multiples_of_the_tiles(qtype: QT) -> None:
    """1408-wide rows (GLM-4.5-Air's experts) are 22 tiles of 64; here 352 and 160 leave partial tiles."""
    rng = np.random.default_rng(int(qtype))
    x, ids, w, sets, dense = _case(rng, qtype, 150, 12, 3, d=160, f=352)
    got = cp.asnumpy(moe_prefill(cp.asarray(x), cp.asarray(ids), cp.asarray(w), *sets))
    _check_against_numpy(got, x, ids, w, dense)


def test_a_token_does_not_depend_on_the_other_tokens_or_the_chunking(monkeypatch) -> None:
    rng = np.random.default_rng(7)
    x, ids, w, sets, _ = _case(rng, QT.Q4_K, 500, 32, 4)
    xd, idsd, wd = cp.asarray(x), cp.asarray(ids), cp.asarray(w)
    whole = cp.asnumpy(moe_prefill(xd, idsd, wd, *sets))
    parts = np.concatenate([cp.asnumpy(moe_prefill(xd[a:b], idsd[a:b], wd[a:b], *sets))
                            for a, b in ((0, 1), (1, 130), (130, 131), (131, 500))])
    assert np.array_equal(whole, parts)
    shuffled = rng.permutation(500)
    again = cp.asnumpy(moe_prefill(xd[shuffled], idsd[shuffled], wd[shuffled], *sets))
    assert np.array_equal(again, whole[shuffled])
    monkeypatch.setattr(moe_prefill_module, "CHUNK_WEIGHT_BYTES", 1)  # one expert per chunk
    assert np.array_equal(cp.asnumpy(moe_prefill(xd, idsd, wd, *sets)), whole)


def test_an_expert_routed_to_but_not_on_the_device_is_named() -> None:
    """Every chunk's addresses go up in one copy; a zero address among them still names its expert."""
    from dataclasses import replace

    rng = np.random.default_rng(3)
    x, ids, w, sets, _ = _case(rng, QT.Q8_0, 40, 16, 2)
    gone = int(ids[-1, 0])
    ptrs = sets[1].ptrs.copy()
    ptrs[gone] = 0
    sets[1] = replace(sets[1], ptrs=ptrs)
    with pytest.raises(ValueError, match=rf"experts \[{gone}\] were routed to but are not on the device"):
        moe_prefill(cp.asarray(x), cp.asarray(ids), cp.asarray(w), *sets)


def test_pair_tiles_cover_each_experts_rows_in_tiles_of_64() -> None:
    offsets = np.array([0, 0, 64, 65, 200, 200, 330])
    tiles = pair_tiles(offsets, np.array([1, 2, 3, 5]))
    assert tiles.tolist() == [[0, 0, 64], [1, 64, 65], [2, 65, 200], [2, 129, 200], [2, 193, 200],
                              [3, 200, 330], [3, 264, 330], [3, 328, 330]]


def test_an_expert_routed_to_but_absent_is_named() -> None:
    rng = np.random.default_rng(1)
    x, ids, w, sets, _ = _case(rng, QT.Q8_0, 20, 8, 2)
    ptrs = sets[0].ptrs.copy()
    ptrs[int(ids[3, 1])] = 0
    sets[0] = ExpertMatrixSet(sets[0].qtype, sets[0].rows, sets[0].row_length, ptrs)
    with pytest.raises(ValueError, match=f"experts \\[{int(ids[3, 1])}\\] were routed to"):
        moe_prefill(cp.asarray(x), cp.asarray(ids), cp.asarray(w), *sets)


def test_grouping_is_stable_and_covers_every_pair() -> None:
    ids = cp.asarray(np.array([[3, 1], [1, 0], [3, 2], [0, 1]], dtype=np.int32))
    order, offsets = group_by_expert(ids, 5)
    assert cp.asnumpy(order).tolist() == [3, 6, 1, 2, 7, 5, 0, 4]
    assert cp.asnumpy(offsets).tolist() == [0, 2, 5, 6, 8, 8]


def test_host_ids_spare_the_sync_and_change_nothing() -> None:
    rng = np.random.default_rng(9)
    x, ids, w, sets, _ = _case(rng, QT.Q4_K, 300, 16, 4)
    xd, idsd, wd = cp.asarray(x), cp.asarray(ids), cp.asarray(w)
    cp.testing.assert_array_equal(moe_prefill(xd, idsd, wd, *sets, ids_host=ids), moe_prefill(xd, idsd, wd, *sets))


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.F16])
@pytest.mark.parametrize("n_tok,n_expert,k,d,f", [(50, 4, 2, 32, 96), (200, 3, 2, 160, 288), (90, 5, 3, 96, 32)])
def test_tile_edges_match_numpy(qtype: QT, n_tok: int, n_expert: int, k: int, d: int, f: int) -> None:
    """One K step (32), K steps not a multiple of the stages (160, 288), widths short of a column tile (96, 32)
    or past whole ones (288, 160), experts with partial row tiles (~130 pairs: 64 + 64 + 2)."""
    rng = np.random.default_rng(n_tok + d + f)
    x, ids, w, sets, dense = _case(rng, qtype, n_tok, n_expert, k, d=d, f=f)
    got = cp.asnumpy(moe_prefill(cp.asarray(x), cp.asarray(ids), cp.asarray(w), *sets))
    _check_against_numpy(got, x, ids, w, dense)
