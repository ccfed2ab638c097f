"""The seam between the MoE op and wherever routed experts live (the file, host RAM, device slots).

`ops.moe(x, ids, weights, w)` asks its backend's `experts` provider for the experts the batch
routed to and computes each one from exactly the bytes it got back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT

from runner.gguf_file import TensorInfo
from runner.models.weights import MoEWeights

MATRICES = ("gate", "up", "down")


@dataclass(frozen=True)
class ExpertMatrices:
    """One expert's three matrices as raw GGUF blocks, uint8 [rows, row_bytes] each, with their types.

    `key` names the bytes' contents (which tensor and expert, or which slot upload), so a cache of
    data derived from them (the numpy backend's dequantized copies) is keyed correctly: a slot
    refilled with another expert gets a new key.
    """

    gate: Any  # numpy or CuPy uint8 [n_ff_exp, row_bytes]
    up: Any  # [n_ff_exp, row_bytes]
    down: Any  # [n_embd, row_bytes]
    gate_qtype: QT
    up_qtype: QT
    down_qtype: QT
    key: str

    def tensor(self, which: str) -> TensorInfo:
        """One matrix as a 2-D TensorInfo named by `key` (what NumpyOps' products take)."""
        raw, qtype = getattr(self, which), getattr(self, f"{which}_qtype")
        block, type_size = GGML_QUANT_SIZES[qtype]
        row_length = raw.shape[1] // type_size * block
        return TensorInfo(f"{self.key}:{which}", qtype, (raw.shape[0], row_length), raw, 0)

    @property
    def nbytes(self) -> int:
        return int(self.gate.nbytes + self.up.nbytes + self.down.nbytes)


class ExpertProvider(Protocol):
    def fetch(self, w: MoEWeights, experts: Sequence[int]) -> Mapping[int, ExpertMatrices]:
        """The matrices of `experts` of the MoE layer `w` (most recently routed first), all valid at once."""
        ...


def moe_layer_index(w: MoEWeights) -> int:
    """The layer number of an MoE layer's weights (its tensors are named blk.N.*)."""
    return int(w.gate_exps.name.split(".")[1])


def raw_expert(info: TensorInfo, expert: int) -> np.ndarray:
    """Expert `expert` of a [n_expert, rows, row_length] tensor as uint8 [rows, row_bytes], a view of the file."""
    data = info.data[expert]
    return data.view(np.uint8).reshape(data.shape[0], -1)


def experts_by_recency(ids: np.ndarray) -> list[int]:
    """The distinct experts in ids [T, k], the last token's first (then by rank), earlier tokens after."""
    flat = np.asarray(ids)[::-1].reshape(-1)
    if flat.size <= 64:  # decode and verify: a dict pass beats numpy's fixed costs
        return list(dict.fromkeys(flat.tolist()))
    # A prompt's 10^5 pairs: each expert's first position in the walk back, then the experts by it, in numpy
    # only. A walk in Python stopped once every expert was seen, which a rarely routed expert put off to the
    # prompt's start: 6 to 12 ms a layer on the GPU box, with the GPU idle behind it (2026-12-06).
    first = np.full(int(flat.max()) + 1, flat.size, dtype=np.int64)
    np.minimum.at(first, flat, np.arange(flat.size))
    present = np.flatnonzero(first < flat.size)
    return present[np.argsort(first[present])].tolist()


class ResidentExperts:
    """Experts straight from the file's tensors (every expert resident): views, nothing copied."""

    def fetch(self, w: MoEWeights, experts: Sequence[int]) -> Mapping[int, ExpertMatrices]:
        g, u, d = w.gate_exps, w.up_exps, w.down_exps
        return {
            e: ExpertMatrices(raw_expert(g, e), raw_expert(u, e), raw_expert(d, e), g.qtype, u.qtype, d.qtype,
                              key=f"{g.name}#{e}")
            for e in experts
        }
