"""Round activations the way llama.cpp's CPU matmul does before it multiplies them with a weight.

ggml's CPU backend converts the activations of every matrix product to the weight type's
`vec_dot_type` (Q8_0, Q8_1 or Q8_K blocks for quantized weights, F16/BF16 for those) and takes
integer or half-precision dot products. Quantizing and dequantizing the activations here, then
multiplying in float32, gives the same products up to float rounding, so greedy tokens agree with
llama.cpp even where two candidates are close. Pure float32 activations remain available.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

Q8_0_TYPES = {QT.Q4_0, QT.Q5_0, QT.Q8_0, QT.IQ4_NL, QT.MXFP4}
Q8_1_TYPES = {QT.Q4_1, QT.Q5_1}  # Q8_1 carries a block sum too; its values round like Q8_0's


def vec_dot_type(weight: QT) -> QT:
    """The activation type ggml's CPU backend pairs with `weight` (ggml-cpu.c type_traits_cpu)."""
    if weight in (QT.F32, QT.F16, QT.BF16):
        return weight
    if weight in Q8_0_TYPES:
        return QT.Q8_0
    if weight in Q8_1_TYPES:
        return QT.Q8_1
    return QT.Q8_K  # the K-quants, IQ2/IQ3/IQ1, IQ4_XS, TQ


def round_activations(x: np.ndarray, weight: QT) -> np.ndarray:
    """x [..., K] float32 as llama.cpp's CPU path sees it when multiplying by a `weight`-typed matrix."""
    kind = vec_dot_type(weight)
    if kind == QT.F32:
        return x
    if kind == QT.F16:
        return x.astype(np.float16).astype(np.float32)
    if kind == QT.BF16:
        return _round_bf16(x)
    if kind == QT.Q8_K:
        return _q8_k(x)
    return _q8_0(x)


def q8_1_sum_error(x: np.ndarray) -> np.ndarray:
    """Per 32-block, llama.cpp's Q8_1 block sum s = fp16(d * sum(q)) minus the sum of the rounded values.

    Q4_1/Q5_1 dot products add weight_min * s per block, so this error times the weight's block
    minima is what llama.cpp's product differs by from dequantized-weight x rounded-activation.
    """
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1)
    inv = np.divide(np.float32(127.0), amax, out=np.zeros_like(amax), where=amax > 0)
    q_sum = np.rint(blocks * inv[..., None]).sum(axis=-1)
    d = amax / np.float32(127.0)
    s = (d * q_sum).astype(np.float16).astype(np.float32)
    return s - d.astype(np.float16).astype(np.float32) * q_sum


def block_minima(raw: np.ndarray, qtype: QT) -> np.ndarray:
    """The fp16 `m` of every Q4_1/Q5_1 block: raw [..., rows, row_bytes] -> float32 [..., rows, blocks]."""
    type_size = {QT.Q4_1: 20, QT.Q5_1: 24}[qtype]
    blocks = raw.reshape(*raw.shape[:-1], -1, type_size)
    return np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0].astype(np.float32)


def _q8_0(x: np.ndarray) -> np.ndarray:
    """Blocks of 32: d = amax/127 stored as fp16, q = rint(x * 127/amax)."""
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    inv = np.divide(np.float32(127.0), amax, out=np.zeros_like(amax), where=amax > 0)
    q = np.rint(blocks * inv)
    d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
    return (q * d).reshape(x.shape)


def _q8_k(x: np.ndarray) -> np.ndarray:
    """Blocks of 256: scale from the signed element of largest magnitude, q = min(127, rint(-127/max * x))."""
    blocks = x.reshape(*x.shape[:-1], -1, 256)
    idx = np.abs(blocks).argmax(axis=-1)[..., None]
    signed_max = np.take_along_axis(blocks, idx, axis=-1)
    iscale = np.divide(np.float32(-127.0), signed_max, out=np.zeros_like(signed_max), where=signed_max != 0)
    q = np.minimum(np.rint(blocks * iscale), 127.0)
    d = np.divide(np.float32(1.0), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return (q * d).reshape(x.shape).astype(np.float32)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)
