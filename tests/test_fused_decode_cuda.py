"""Decode's fused ops on the CUDA backend against the ops they replace, bit for bit (issue 20: fewer launches
a step): swiglu_ffn (gate, up and SwiGLU in one expert_gate_up launch, then down). The rotary-and-store
fusion is in tests/test_norm_rope_cuda.py, the GEMV's bias in tests/test_gemv_cuda.py."""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda.ops import CudaOps  # noqa: E402
from runner.engine.engine import Engine, EngineConfig  # noqa: E402
from runner.models.weights import MoEWeights  # noqa: E402


# The tiny qwen3moe has neither a dense layer nor a shared expert: glm4moe (a leading dense layer, shared experts)
# and qwen3next (a gated shared expert in every layer) have both kinds of feed-forward.
@pytest.mark.parametrize("arch,quant", [("glm4moe", "Q4_K_M"), ("glm4moe", "IQ4_XS"), ("glm4moe", "Q6_K"),
                                        ("glm4moe", "F32"), ("qwen3next", "Q4_K_M")])
def test_swiglu_ffn_has_the_bits_of_its_three_ops(synth_model, arch: str, quant: str) -> None:
    """Dense feed-forwards and shared experts at 1..8 rows: expert_gate_up over one pair per row, then down, gives
    what linear, linear, swiglu, linear give, bit for bit; past 8 rows the three ops themselves."""
    ops = CudaOps()
    model = Engine.load(synth_model(arch, quant), EngineConfig(n_ctx=64), ops=ops).model
    ffns = [lw.ffn.shared if isinstance(lw.ffn, MoEWeights) else lw.ffn for lw in model.weights.layers]
    ffns = [w for w in ffns if w is not None]
    assert ffns, "the synthetic model has a dense layer or a shared expert"
    rng = np.random.default_rng(11)
    for w in ffns[:2]:
        for rows in (1, 3, 8, 9):
            x = cp.asarray(rng.standard_normal((rows, model.cfg.n_embd)).astype(np.float32))
            want = ops.linear(ops.swiglu(ops.linear(x, w.gate), ops.linear(x, w.up)), w.down)
            got = ops.swiglu_ffn(x, w.gate, w.up, w.down)
            assert got.shape == want.shape and cp.array_equal(got.view(cp.uint32), want.view(cp.uint32)), (rows, w.gate.name)
