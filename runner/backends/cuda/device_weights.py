"""The model's tensors on the GPU: raw GGUF blocks uploaded once, each reserved in the device budget.

Quantized weights stay in their GGUF blocks ([rows, row_bytes] uint8; the kernels decode them as
they read), 1-D tensors (norms, biases, the routing bias) become float32 vectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import cupy as cp
import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.budget import DeviceBudget
from runner.errors import ModelFileError
from runner.gguf_file import TensorInfo


@dataclass(frozen=True)
class DeviceTensor:
    name: str
    qtype: QT
    shape: tuple[int, ...]  # numpy order, as in the file
    raw: cp.ndarray  # uint8 [rows, row_bytes]; an expert tensor's rows run expert by expert

    @property
    def row_length(self) -> int:
        return self.shape[-1]

    @property
    def row_bytes(self) -> int:
        return int(self.raw.shape[1])

    @property
    def rows_per_expert(self) -> int:
        return self.shape[-2]

    @property
    def expert_bytes(self) -> int:
        return self.rows_per_expert * self.row_bytes

    def expert(self, e: int) -> cp.ndarray:
        n = self.rows_per_expert
        return self.raw[e * n : (e + 1) * n]


def raw_rows(info: TensorInfo) -> np.ndarray:
    """The tensor's bytes as [rows, row_bytes] uint8 (F32/F16 views are reinterpreted, not converted)."""
    block, type_size = GGML_QUANT_SIZES[info.qtype]
    if info.row_length % block:
        raise ModelFileError(f"tensor '{info.name}' rows of {info.row_length} are not whole {info.qtype.name} blocks")
    row_bytes = info.row_length // block * type_size
    data = np.ascontiguousarray(info.data).view(np.uint8)
    return data.reshape(-1, row_bytes)


class DeviceWeights:
    """Uploads tensors on first use and keeps them; every upload is reserved in `budget` by name."""

    def __init__(self, budget: DeviceBudget, upload_progress: Callable[[int], None] | None = None):
        self.budget = budget
        self.progress = upload_progress or (lambda nbytes: None)
        self._tensors: dict[str, DeviceTensor] = {}
        self._vectors: dict[str, cp.ndarray] = {}

    def tensor(self, info: TensorInfo) -> DeviceTensor:
        got = self._tensors.get(info.name)
        if got is None:
            host = raw_rows(info)
            self.budget.reserve(f"weight {info.name}", host.nbytes)
            got = DeviceTensor(info.name, info.qtype, info.shape, cp.asarray(host))
            self._tensors[info.name] = got
            self.progress(host.nbytes)
        return got

    def vector(self, info: TensorInfo) -> cp.ndarray:
        """A float32 copy of a (small, F32) tensor such as a norm weight or bias."""
        got = self._vectors.get(info.name)
        if got is None:
            if info.qtype != QT.F32:
                from gguf.quants import dequantize

                host = dequantize(info.data, info.qtype).astype(np.float32).reshape(info.shape)
            else:
                host = np.ascontiguousarray(info.data, dtype=np.float32).reshape(info.shape)
            self.budget.reserve(f"weight {info.name}", host.nbytes)
            got = cp.asarray(host)
            self._vectors[info.name] = got
        return got

    @property
    def nbytes(self) -> int:
        return sum(t.raw.nbytes for t in self._tensors.values()) + sum(v.nbytes for v in self._vectors.values())
