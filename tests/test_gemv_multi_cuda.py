"""gemv_multi (two or three products of the same rows in one launch) against gemv, bit for bit.

Each matrix's tiles run gemv_body as a gemv launch of their own does, so every column must have the bits of that
launch: any types (each its own unit and layout), row counts 1..8, column counts off the tile size, with and
without biases; and CudaOps.linears (attention's q, k, v) against its linear calls.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.cuda.kernels import gpu_available
from runner.backends.limits import SMALL_BATCH_ROWS

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda.gemv import gemv, gemv_multi  # noqa: E402
from test_gemv_cuda import assert_bitwise_equal, weights  # noqa: E402

# (types, column counts, row length): attention's q, k, v of the seed shape (v Q6_K on llama.cpp's
# use_more_bits layers), two matrices only, float and 32-value block types, N off the 32-column tile.
CASES = {
    "seed-qkv": ((QT.Q4_K, QT.Q4_K, QT.Q6_K), (2048, 512, 512), 2048),
    "two": ((QT.Q8_0, QT.Q4_0), (96, 33), 512),
    "floats-and-blocks": ((QT.F16, QT.Q5_0, QT.F32), (40, 7, 65), 256),
    "iq-and-k": ((QT.IQ4_XS, QT.Q5_K, QT.IQ2_XXS), (31, 64, 1), 768),
}


def _case(name: str, seed: int):
    qtypes, ns, k = CASES[name]
    rng = np.random.default_rng(seed)
    mats = [(cp.asarray(weights(rng, q, (n, k))[0]), q) for q, n in zip(qtypes, ns)]
    biases = [cp.asarray(rng.standard_normal(n).astype(np.float32)) for n in ns]
    return rng, mats, biases, k


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("rows", [1, 3, SMALL_BATCH_ROWS])
def test_each_product_has_the_bits_of_its_own_gemv(name: str, rows: int) -> None:
    rng, mats, biases, k = _case(name, 5)
    x = cp.asarray(rng.standard_normal((rows, k)).astype(np.float32))
    for with_bias in (False, True):
        bs = [b if with_bias and i != 1 else None for i, b in enumerate(biases)]  # the middle one without
        got = gemv_multi(x, mats, bs)
        assert len(got) == len(mats)
        for i, ((w, q), b, y) in enumerate(zip(mats, bs, got)):
            assert_bitwise_equal(y, gemv(x, w, q, k, bias=b), f"{name} matrix {i} ({q.name}), bias {b is not None}")


def test_refuses_one_matrix_or_four() -> None:
    _, mats, biases, k = _case("seed-qkv", 6)
    x = cp.zeros((1, k), dtype=cp.float32)
    with pytest.raises(AssertionError, match="2 to 3 matrices"):
        gemv_multi(x, mats[:1], biases[:1])
    with pytest.raises(AssertionError, match="2 to 3 matrices"):
        gemv_multi(x, [*mats, mats[0]], [*biases, None])


@pytest.mark.parametrize("arch", ["glm4moe", "qwen3moe"])  # with and without q, k, v biases
def test_cuda_ops_linears_equal_their_linear_calls(synth_model, arch: str) -> None:
    """Attention's q, k and v through CudaOps.linears (one launch) and through linear (three launches)."""
    from runner.backends.cuda.ops import CudaOps
    from runner.gguf_file import open_gguf
    from runner.models.config import model_config
    from runner.models.weights import load_weights

    f = open_gguf(synth_model(arch, "Q4_K_M", direct=True))
    cfg = model_config(f)
    w = load_weights(f, cfg)
    ops = CudaOps()
    ops.check_weights(w.all_tensors())
    a = w.layers[0].attn
    projections, biases = (a.wq, a.wk, a.wv), (a.bq, a.bk, a.bv)
    for rows in (1, 4):
        x = cp.asarray(np.random.default_rng(rows).standard_normal((rows, cfg.n_embd)).astype(np.float32))
        for y, wt, b in zip(ops.linears(x, projections, biases), projections, biases):
            assert_bitwise_equal(y, ops.linear(x, wt, b), f"{wt.name}, {rows} rows")


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q8_0, QT.F16, QT.IQ4_XS])
@pytest.mark.parametrize("rows", [1, 4, SMALL_BATCH_ROWS])
def test_a_residual_added_in_the_launch_has_the_bits_of_adding_it_after(qtype: QT, rows: int) -> None:
    """gemv(..., bias=b, residual=r) is r + (x W^T + b), each add rounded once in that order (the attention output
    projection's skip connection in its GEMV launch)."""
    rng = np.random.default_rng(7)
    n, k = 96, 512
    w = cp.asarray(weights(rng, qtype, (n, k))[0])
    x = cp.asarray(rng.standard_normal((rows, k)).astype(np.float32))
    b = cp.asarray(rng.standard_normal(n).astype(np.float32))
    r = cp.asarray(rng.standard_normal((rows, n)).astype(np.float32))
    assert_bitwise_equal(gemv(x, w, qtype, k, residual=r), r + gemv(x, w, qtype, k), f"{qtype.name} residual")
    assert_bitwise_equal(gemv(x, w, qtype, k, bias=b, residual=r), r + (gemv(x, w, qtype, k) + b),
                         f"{qtype.name} bias and residual")
