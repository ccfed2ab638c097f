"""Random but valid GGUF tensor data, written straight as quant blocks (no float weights, no quantizer).

Every block starts as random bytes, which are valid quants and sub-block scales for all types here;
only the block's float scale fields are then overwritten: the fp16 `d` (and `dmin`/`m` for types with
a minimum), or MXFP4's E8M0 exponent byte. Their values come from a once-per-type calibration
against gguf.quants.dequantize, so the dequantized tensor has mean ~0 and the requested std.
F32 is drawn with standard_normal; F16/BF16 look random bits up in a table of normal quantiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize, quant_shape_to_byte_shape

from runner.errors import SynthError


@dataclass(frozen=True)
class _Layout:
    d_off: int  # byte offset of the fp16 super-block scale (MXFP4: the E8M0 exponent byte)
    min_off: int | None = None  # byte offset of the fp16 minimum, for types that have one


# Field offsets from ggml-common.h. Types without a minimum dequantize to d * (symmetric-ish code),
# so a random sign on d centres them; types with a minimum get min = ratio * d instead.
_LAYOUTS: dict[QT, _Layout] = {
    QT.Q4_0: _Layout(0),
    QT.Q5_0: _Layout(0),
    QT.Q8_0: _Layout(0),
    QT.Q4_1: _Layout(0, 2),
    QT.Q5_1: _Layout(0, 2),
    QT.Q2_K: _Layout(80, 82),  # scales[16], qs[64], d, dmin
    QT.Q3_K: _Layout(108),  # hmask[32], qs[64], scales[12], d
    QT.Q4_K: _Layout(0, 2),  # d, dmin, scales[12], qs[128]
    QT.Q5_K: _Layout(0, 2),  # d, dmin, scales[12], qh[32], qs[128]
    QT.Q6_K: _Layout(208),  # ql[128], qh[64], scales[16], d
    QT.IQ4_NL: _Layout(0),
    QT.IQ4_XS: _Layout(0),  # d, scales_h, scales_l[4], qs[128]
    QT.MXFP4: _Layout(0),  # e (E8M0), qs[16]; the fp4 values are symmetric, no sign needed
}
_FLOATS = (QT.F32, QT.F16, QT.BF16)
DIRECT_QTYPES: frozenset[QT] = frozenset(_FLOATS) | frozenset(_LAYOUTS)

_CHUNK_BYTES = 1 << 20  # generate about 1 MiB at a time: cache friendly, small temporaries
_JITTER = 0.5  # per-block log-scale spread (uniform), so blocks are not all alike
_JITTER_MS = math.sinh(_JITTER) / _JITTER  # E[f^2] for f = exp(U(-J/2, J/2)); divided out below
_U16 = np.dtype("<u2")  # GGUF is little-endian whatever the host is


def random_tensor(rng: np.random.Generator, qtype: QT, shape: tuple[int, ...], std: float) -> np.ndarray:
    """Random data for a tensor of logical numpy shape (..., rows, row_length) stored as `qtype`.

    F32/F16 give float arrays of `shape`; BF16 and quant types give the uint8 byte array that
    GGUFWriter.add_tensor(name, arr, raw_dtype=qtype) expects. Dequantized: mean ~0, std ~`std`.
    """
    qtype = QT(qtype)
    if qtype not in DIRECT_QTYPES:
        names = ", ".join(sorted(t.name for t in DIRECT_QTYPES))
        raise SynthError(f"cannot write {qtype.name} blocks directly; supported: {names}")
    shape = tuple(int(n) for n in shape)
    if not shape or min(shape) < 1:
        raise SynthError(f"tensor shape {shape} must have at least one dimension, all positive")
    if not (math.isfinite(std) and std > 0):
        raise SynthError(f"standard deviation must be finite and positive, got {std}")
    block, type_size = GGML_QUANT_SIZES[qtype]
    if shape[-1] % block:
        raise SynthError(f"row length {shape[-1]} is not a multiple of {qtype.name}'s block size {block}")
    if qtype in _FLOATS:
        return _random_float(rng, qtype, shape, std)

    n_blocks = math.prod(shape) // block
    out = np.empty(n_blocks * type_size, dtype=np.uint8)
    per_chunk = max(1, _CHUNK_BYTES // type_size)
    for first in range(0, n_blocks, per_chunk):
        count = min(per_chunk, n_blocks - first)
        chunk = out[first * type_size : (first + count) * type_size]
        # random_raw is ~8x faster than rng.integers/rng.bytes and deterministic for the seed.
        raw = rng.bit_generator.random_raw(-(-chunk.size // 8)).view(np.uint8)
        chunk[:] = raw[: chunk.size]
        _set_scales(qtype, chunk.reshape(count, type_size), std)
    return out.reshape(quant_shape_to_byte_shape(shape, qtype))


def _random_float(rng: np.random.Generator, qtype: QT, shape: tuple[int, ...], std: float) -> np.ndarray:
    if qtype == QT.F32:
        out = rng.standard_normal(shape, dtype=np.float32)
        out *= np.float32(std)
        return out
    # F16/BF16: 16 random bits index a table of normal quantiles, ~4x faster than standard_normal.
    table = _half_table(qtype, std)
    flat = np.empty(math.prod(shape), dtype=table.dtype)
    step = _CHUNK_BYTES // 2
    for first in range(0, flat.size, step):
        count = min(step, flat.size - first)
        index = rng.bit_generator.random_raw(-(-count // 4)).view(_U16)[:count]
        flat[first : first + count] = table[index]
    if qtype == QT.F16:
        return flat.reshape(shape)
    return flat.view(np.uint8).reshape(quant_shape_to_byte_shape(shape, qtype))


@lru_cache(maxsize=64)
def _half_table(qtype: QT, std: float) -> np.ndarray:
    """std * the 65536 mid-point quantiles of N(0, 1) (tails at about 4.3 sigma), as F16 or BF16 bits."""
    values = (_normal_quantiles() * np.float32(std)).astype(np.float32)
    if qtype == QT.F16:
        return values.astype(np.float16)
    bits = values.view(np.uint32)  # BF16: round to nearest even, as ggml_compute_fp32_to_bf16 does
    return ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(_U16)


@lru_cache(maxsize=1)
def _normal_quantiles() -> np.ndarray:
    unit = NormalDist()
    return np.array([unit.inv_cdf((k + 0.5) / 65536) for k in range(65536)], dtype=np.float32)


def _set_scales(qtype: QT, blocks: np.ndarray, std: float) -> None:
    """Overwrite each block's scale fields in place, driven by the random bits already in them."""
    layout = _LAYOUTS[qtype]
    if qtype == QT.MXFP4:
        blocks[:, 0] = _mxfp4_exponent_table(std)[blocks[:, 0]]
        return
    words = blocks.view(_U16)  # every layout here has an even block size and even field offsets
    seed_bits = words[:, layout.d_off // 2]  # random: picks each block's jitter (and sign)
    d_table, min_table = _fp16_tables(qtype, std)
    if layout.min_off is not None:
        words[:, layout.min_off // 2] = min_table[seed_bits]
    words[:, layout.d_off // 2] = d_table[seed_bits]


@lru_cache(maxsize=64)  # 256 KiB per entry; tensors use only a few distinct stds
def _fp16_tables(qtype: QT, std: float) -> tuple[np.ndarray, np.ndarray]:
    """Maps the 16 random bits of a block's d field to its new fp16 d and min bit patterns.

    The low 15 bits give a uniform log-jitter f; d = d0 * f and min = ratio * d. For types with no
    minimum the top bit is kept as d's sign, which centres them (their codes average -0.5, not 0).
    """
    ratio, unit_rms = _calibration(qtype)
    bits = np.arange(1 << 16, dtype=np.uint32)
    u = ((bits & 0x7FFF) + 0.5) / 32768.0
    d = (std / unit_rms / math.sqrt(_JITTER_MS)) * np.exp(_JITTER * (u - 0.5))
    d16 = d.astype(np.float16)
    if not np.all(np.isfinite(d16)) or not np.all(d16 > 0):
        raise SynthError(f"std {std} is outside what {qtype.name}'s fp16 block scales can represent")
    min16 = (d16.astype(np.float32) * np.float32(ratio)).astype(np.float16)
    d_bits = d16.view(_U16)
    if _LAYOUTS[qtype].min_off is None:
        d_bits = d_bits | (bits & 0x8000).astype(_U16)
    return d_bits, min16.view(_U16)


@lru_cache(maxsize=256)
def _mxfp4_exponent_table(std: float) -> np.ndarray:
    """Maps a random byte to an E8M0 exponent: e0 or e0 + 1, mixed so the mean square is exact.

    A power-of-two scale alone would miss `std` by up to sqrt(2); the mix hits it on average.
    """
    _, unit_rms = _calibration(QT.MXFP4)  # rms at e = 127 (scale 2^0 applied to doubled e2m1 / 2)
    target = std / unit_rms
    k = math.floor(math.log2(target))
    p_up = (target * target / 4.0**k - 1.0) / 3.0  # (1-p) * 4^k + p * 4^(k+1) = target^2
    e0 = 127 + k
    if not 1 <= e0 <= 253:
        raise SynthError(f"std {std} is outside what MXFP4's E8M0 block scales can represent")
    up = np.arange(256) < round(p_up * 256)
    return (e0 + up).astype(np.uint8)


@lru_cache(maxsize=None)
def _calibration(qtype: QT) -> tuple[float, float]:
    """(min / d ratio that centres the mean, rms of the values at d = 1), measured with gguf.quants.

    Uses a fixed seed so results never depend on the caller's generator.
    """
    layout = _LAYOUTS[qtype]
    _, type_size = GGML_QUANT_SIZES[qtype]
    sample = np.random.default_rng(20240601).integers(0, 256, (16384, type_size), dtype=np.uint8)
    if qtype == QT.MXFP4:
        sample[:, 0] = 127
        return 0.0, _rms(dequantize(sample, qtype))

    def with_fields(d: float, m: float) -> np.ndarray:
        blocks = sample.copy()
        words = blocks.view(_U16)
        words[:, layout.d_off // 2] = np.float16(d).view(_U16)
        if layout.min_off is not None:
            words[:, layout.min_off // 2] = np.float16(m).view(_U16)
        return dequantize(blocks, qtype)

    ratio = 0.0
    if layout.min_off is not None:
        ratio = -float(with_fields(1.0, 0.0).mean()) / float(with_fields(0.0, 1.0).mean())
    return ratio, _rms(with_fields(1.0, ratio))


def _rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(values, dtype=np.float64))))
