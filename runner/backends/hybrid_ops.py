"""The ops the hybrid linear-attention families (qwen35moe, qwen3next; runner/models/hybrid.py) call
beyond the Ops protocol: Gated DeltaNet, multi-section rotary and sigmoid gates.

Kept apart from Ops so a backend can serve the other families before it has these: NumpyOps implements
them (the math in backends/numpy/delta_net.py is the reference), CudaOps too (backends/cuda/hybrid.py,
kernels in cuda/delta_net.cu); a backend without them refuses a hybrid model at load (`supports_hybrid`). ssm_conv and gated_delta_net return new arrays and never write
the state they are given: the sequence cache keeps earlier states by reference (engine/hybrid_cache.py).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from runner.backends.ops import Array, Ops
from runner.backends.step import Step
from runner.gguf_file import TensorInfo


@runtime_checkable
class HybridOps(Ops, Protocol):
    def sigmoid(self, x: Array) -> Array:
        """Elementwise 1 / (1 + e^-x) (gated attention's output gate, the shared expert's gate)."""

    def l2_norm(self, x: Array, eps: float) -> Array:
        """x / sqrt(sum x^2 + eps) over the last axis."""

    def rope_multi(self, x: Array, positions: np.ndarray, n_rot: int, base: float, sections: tuple[int, ...],
                   step: Step) -> Array:
        """NEOX-paired rotary of x [T, H, D] with llama.cpp's interleaved sections for text positions:
        a pair in section t, h or w rotates by the position, one in e by 0."""

    def ssm_conv(self, x: Array, state: Array, w: TensorInfo) -> tuple[Array, Array]:
        """SiLU of the causal depthwise conv (w [C, K]) of x [T, C] after `state` [K-1, C];
        (y [T, C], window [K-1+T, C]: the state followed by x)."""

    def delta_net_gates(self, alpha: Array, beta: Array, dt_bias: TensorInfo, a: TensorInfo) -> tuple[Array, Array]:
        """alpha, beta [T, H_v] -> (g = softplus(alpha + dt_bias) * a, sigmoid(beta))."""

    def gated_delta_net(self, q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array, grouped: bool,
                        keep_states: bool) -> tuple[Array, Array]:
        """The gated delta rule over a batch from `state` [H_v, S, S]: (o [T, H_v, S], the state after every
        row [T, H_v, S, S] when keep_states, else after the last [1, H_v, S, S])."""


def supports_hybrid(ops: Any) -> bool:
    return isinstance(ops, HybridOps)
