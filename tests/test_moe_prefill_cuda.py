"""The prefill expert path (cuda/moe_prefill.cu + batched cuBLAS GEMMs) against a float64 numpy twin.

Tolerance: activations, weights and the SwiGLU output are rounded to fp16 (relative 4.9e-4 each)
before float32-accumulated GEMMs, so each output may move by about 3e-3 of the magnitude of its
terms: |y - ref| <= 3e-3 * (|h| @ |W_down|^T) + 1e-6 is asserted per pair.
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
from runner.backends.cuda.moe_prefill import ExpertMatrixSet, group_by_expert, moe_prefill  # noqa: E402
from runner.synth.random_blocks import random_tensor  # noqa: E402


def expert_tensor(rng, name: str, qtype: QT, n_expert: int, rows: int, cols: int):
    data = random_tensor(rng, qtype, (n_expert, rows, cols), std=0.05)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(n_expert * rows, -1)
    dense = dequantize(data, qtype).astype(np.float64).reshape(n_expert, rows, cols)
    return DeviceTensor(name, qtype, (n_expert, rows, cols), cp.asarray(raw)), dense


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q8_0, QT.F16, QT.Q6_K])
@pytest.mark.parametrize("n_tok,n_expert,k", [(9, 8, 2), (300, 16, 4), (64, 128, 8)])
def test_grouped_prefill_experts_match_numpy(qtype: QT, n_tok: int, n_expert: int, k: int) -> None:
    rng = np.random.default_rng(n_tok + n_expert)
    d, f = 256, 512
    gate, g = expert_tensor(rng, "gate", qtype, n_expert, f, d)
    up, u = expert_tensor(rng, "up", qtype, n_expert, f, d)
    down, dn = expert_tensor(rng, "down", qtype, n_expert, d, f)
    x = rng.standard_normal((n_tok, d)).astype(np.float32)
    ids = np.stack([rng.choice(n_expert, size=k, replace=False) for _ in range(n_tok)]).astype(np.int32)
    sets = [ExpertMatrixSet.resident(t) for t in (gate, up, down)]
    got = cp.asnumpy(moe_prefill(cp.asarray(x), cp.asarray(ids), *sets))
    for p, (t, e) in enumerate(zip(np.repeat(np.arange(n_tok), k), ids.reshape(-1))):
        gv, uv = g[e] @ x[t], u[e] @ x[t]
        h = gv / (1 + np.exp(-gv)) * uv
        want = dn[e] @ h
        bound = 3e-3 * (np.abs(dn[e]) @ np.abs(h)) + 1e-6
        assert np.all(np.abs(got[p] - want) <= bound), f"pair {p} (token {t}, expert {e})"


def test_grouping_is_stable_and_covers_every_pair() -> None:
    ids = cp.asarray(np.array([[3, 1], [1, 0], [3, 2], [0, 1]], dtype=np.int32))
    order, offsets = group_by_expert(ids, 5)
    assert cp.asnumpy(order).tolist() == [3, 6, 1, 2, 7, 5, 0, 4]
    assert cp.asnumpy(offsets).tolist() == [0, 2, 5, 6, 8, 8]
