"""Random valid blocks of the types runner.synth.random_blocks does not write: the IQ1/IQ2/IQ3 grid types,
TQ1_0 and TQ2_0, for the CUDA tests. Imports only numpy and gguf (the GPU box has no llama_cpp).

Every byte pattern is a valid grid index, sign, sub-block scale or ternary code for these types, so a
block is random bytes with a finite fp16 super-block scale d of either sign written over its field.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize

GRID_QTYPES: tuple[QT, ...] = (
    QT.IQ1_S, QT.IQ1_M, QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ3_XXS, QT.IQ3_S, QT.TQ1_0, QT.TQ2_0,
)
# Byte offset of the fp16 d (ggml-common.h); IQ1_M keeps d's 16 bits in the top nibbles of its 4 scale words.
D_OFFSETS: dict[QT, int] = {
    QT.IQ1_S: 0, QT.IQ2_XXS: 0, QT.IQ2_XS: 0, QT.IQ2_S: 0, QT.IQ3_XXS: 0, QT.IQ3_S: 0, QT.TQ1_0: 52, QT.TQ2_0: 64,
}
IQ1_M_SCALES = 48  # byte offset of IQ1_M's scales[4] (u16)


def random_grid_blocks(rng: np.random.Generator, qtype: QT, shape: tuple[int, ...],
                       std: float | None = None) -> np.ndarray:
    """uint8 [prod(shape[:-1]), row_bytes]: random blocks for a tensor of logical `shape` (..., row_length).

    Each block's d is +-2^u: u uniform in [-14, -6) (normal fp16, values of every size), or with `std`
    given, log2(std / rms at d = 1) +- 0.5, so the values have about that standard deviation (weights).
    """
    block, type_size = GGML_QUANT_SIZES[qtype]
    rows, row_length = int(np.prod(shape[:-1])), int(shape[-1])
    assert row_length % block == 0, f"{qtype.name} rows are whole blocks of {block}"
    n_blocks = rows * row_length // block
    raw = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    if std is None:
        log2_d = rng.uniform(-14, -6, n_blocks)
    else:
        log2_d = np.log2(std / _rms_at_unit_scale(qtype)) + rng.uniform(-0.5, 0.5, n_blocks)
    set_d(raw, qtype, (np.exp2(log2_d) * rng.choice([-1.0, 1.0], n_blocks)).astype(np.float16))
    return raw.reshape(rows, -1)


@lru_cache(maxsize=None)
def _rms_at_unit_scale(qtype: QT) -> float:
    raw = np.random.default_rng(0).integers(0, 256, (4096, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)
    set_d(raw, qtype, np.ones(len(raw), dtype=np.float16))
    return float(np.sqrt(np.mean(np.square(dequantize(raw, qtype), dtype=np.float64))))


def set_d(raw: np.ndarray, qtype: QT, d: np.ndarray) -> None:
    """Write float16 `d` [n_blocks] into the blocks `raw` [n_blocks, type_size] of `qtype`, in place."""
    bits = d.astype(np.float16).view(np.uint16)
    if qtype == QT.IQ1_M:
        words = raw[:, IQ1_M_SCALES : IQ1_M_SCALES + 8].copy().view("<u2")  # [n_blocks, 4]
        for i in range(4):  # nibble i of d goes to bits 12..15 of word i
            words[:, i] = (words[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 0xF) << 12)
        raw[:, IQ1_M_SCALES : IQ1_M_SCALES + 8] = words.view(np.uint8)
        return
    offset = D_OFFSETS[qtype]
    raw[:, offset : offset + 2] = bits.astype("<u2").view(np.uint8).reshape(-1, 2)
