"""NumpyOps's methods of the HybridOps protocol (runner/backends/hybrid_ops.py): thin wrappers that read
the weights they need and call the reference math in delta_net.py."""

from __future__ import annotations

from typing import Any

import numpy as np

from runner.backends.numpy import delta_net
from runner.backends.step import RESIDENT, Step
from runner.gguf_file import TensorInfo

Array = np.ndarray


class NumpyHybridOps:
    cache: Any  # NumpyOps's DequantCache: float32 copies of the file's weights

    def sigmoid(self, x: Array) -> Array:
        return delta_net.sigmoid(x)

    def l2_norm(self, x: Array, eps: float) -> Array:
        return delta_net.l2_norm(x, eps)

    def rope_multi(self, x: Array, positions: np.ndarray, n_rot: int, base: float, sections: tuple[int, ...],
                   step: Step = RESIDENT) -> Array:
        return delta_net.rope_multi(x, positions, n_rot, base, sections)

    def ssm_conv(self, x: Array, state: Array, w: TensorInfo) -> tuple[Array, Array]:
        return delta_net.ssm_conv(x, state, self.cache.get(w))

    def delta_net_gates(self, alpha: Array, beta: Array, dt_bias: TensorInfo, a: TensorInfo) -> tuple[Array, Array]:
        return delta_net.delta_net_gates(alpha, beta, self.cache.get(dt_bias), self.cache.get(a))

    def gated_delta_net(self, q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array, grouped: bool,
                        keep_states: bool) -> tuple[Array, Array]:
        return delta_net.gated_delta_net(q, k, v, g, beta, state, grouped, keep_states)
