"""CudaOps's methods of the HybridOps protocol (runner/backends/hybrid_ops.py): thin wrappers that fetch the
device weights they need and launch the kernels of cuda/delta_net.cu (backends/cuda/delta_net.py), the
twins of NumpyHybridOps."""

from __future__ import annotations

from typing import Any

import cupy as cp
import numpy as np
from gguf import GGMLQuantizationType as QT

from runner.backends.cuda import delta_net as delta_net_cuda
from runner.backends.cuda.dequant import dequantize
from runner.backends.step import RESIDENT, Step
from runner.gguf_file import TensorInfo


class CudaHybridOps:
    weights: Any  # CudaOps's DeviceWeights
    _device_positions: Any  # CudaOps's positions upload (a graph step's device buffer)
    prefill_precision: str  # CudaOps's: "f16" lets prompts use tensor cores, "f32" keeps exact float32 math

    def sigmoid(self, x: cp.ndarray) -> cp.ndarray:
        return delta_net_cuda.sigmoid(cp.ascontiguousarray(x))

    def l2_norm(self, x: cp.ndarray, eps: float) -> cp.ndarray:
        return delta_net_cuda.l2_norm(cp.ascontiguousarray(x), eps)

    def rope_multi(self, x: cp.ndarray, positions: np.ndarray, n_rot: int, base: float, sections: tuple[int, ...],
                   step: Step = RESIDENT) -> cp.ndarray:
        return delta_net_cuda.rope_multi(cp.ascontiguousarray(x), self._device_positions(positions, step), n_rot,
                                         base, sections)

    def ssm_conv(self, x: cp.ndarray, state: cp.ndarray, w: TensorInfo) -> tuple[cp.ndarray, cp.ndarray]:
        return delta_net_cuda.ssm_conv(cp.ascontiguousarray(x), cp.ascontiguousarray(state), self._dense(w))

    def delta_net_gates(self, alpha: cp.ndarray, beta: cp.ndarray, dt_bias: TensorInfo,
                        a: TensorInfo) -> tuple[cp.ndarray, cp.ndarray]:
        return delta_net_cuda.delta_net_gates(cp.ascontiguousarray(alpha), cp.ascontiguousarray(beta),
                                              self.weights.vector(dt_bias), self.weights.vector(a))

    def gated_delta_net(self, q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, g: cp.ndarray, beta: cp.ndarray,
                        state: cp.ndarray, grouped: bool, keep_states: bool) -> tuple[cp.ndarray, cp.ndarray]:
        c = cp.ascontiguousarray
        return delta_net_cuda.gated_delta_net(c(q), c(k), c(v), c(g), c(beta), c(state), grouped, keep_states,
                                              tensor_cores=self.prefill_precision == "f16")

    def _dense(self, w: TensorInfo) -> cp.ndarray:
        """A small matrix (ssm_conv1d) as float32 [rows, cols]: a view of its uploaded blocks when F32 (the
        type llama.cpp's quantizer leaves it), else dequantized on each call."""
        t = self.weights.tensor(w)
        if t.qtype == QT.F32:
            return t.raw.view(cp.float32).reshape(t.shape)
        return dequantize(t.raw, t.qtype, t.row_length, np.float32).reshape(t.shape)
