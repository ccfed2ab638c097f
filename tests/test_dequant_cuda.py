"""runner.backends.cuda.dequant against its numpy twin gguf.quants.dequantize, on the same bytes, for every type."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize as dequantize_numpy

import runner
from grid_blocks import GRID_QTYPES, random_grid_blocks
from runner.backends.cuda.kernels import gpu_available, load_module

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not gpu_available(), reason="needs an NVIDIA GPU with CuPy"),
]

if gpu_available():
    import cupy

    from runner.backends.cuda.dequant import SUPPORTED_QTYPES, dequantize, dequantize_gather
else:
    SUPPORTED_QTYPES = frozenset()

# Listed here, not read off SUPPORTED_QTYPES, so CI collects (and skips) the same test ids.
QTYPES = [
    QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1,
    QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_NL, QT.IQ4_XS, QT.MXFP4, *GRID_QTYPES,
]
# id -> (rows, row length given the block size); 4096 and 11008 are multiples of every block size.
SHAPES = {
    "1x1block": (1, lambda block: block),
    "7x3blocks": (7, lambda block: 3 * block),
    "33x1block": (33, lambda block: block),
    "33x3blocks": (33, lambda block: 3 * block),
    "1x4096": (1, lambda block: 4096),
    "7x11008": (7, lambda block: 11008),
}
# Byte offsets of each block's fp16 scale fields (ggml-common.h); MXFP4's E8M0 exponent is byte 0.
# IQ1_M's d is spread over 4 nibbles: left random (NaN and inf in about 1 block of 32).
SCALE_OFFSETS = {
    QT.Q8_0: (0,), QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2),
    QT.Q2_K: (80, 82), QT.Q3_K: (108,), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,),
    QT.IQ4_NL: (0,), QT.IQ4_XS: (0,), QT.IQ1_S: (0,), QT.IQ2_XXS: (0,), QT.IQ2_XS: (0,), QT.IQ2_S: (0,),
    QT.IQ3_XXS: (0,), QT.IQ3_S: (0,), QT.TQ1_0: (52,), QT.TQ2_0: (64,),
}


def _random_tensor():
    """runner.synth.random_blocks.random_tensor, loaded without runner/synth/__init__.py,
    which imports llama_cpp (not installed on the GPU box)."""
    name = "runner.synth.random_blocks"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(runner.__file__).parent / "synth" / "random_blocks.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up here
        spec.loader.exec_module(module)
    return sys.modules[name].random_tensor


def valid_blocks(rng: np.random.Generator, qtype: QT, rows: int, row_length: int) -> np.ndarray:
    if qtype in GRID_QTYPES:  # types runner.synth does not write
        return random_grid_blocks(rng, qtype, (rows, row_length))
    data = _random_tensor()(rng, qtype, (rows, row_length), 0.02)
    return data.view(np.uint8).reshape(rows, -1)


def random_byte_blocks(rng: np.random.Generator, qtype: QT, rows: int, row_length: int) -> np.ndarray:
    """Fully random bytes, then sane scales: fp16 of either sign over 2^-20..2^-2 (fp16 subnormals too)."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows * row_length // block, type_size), dtype=np.uint8)
    if qtype == QT.MXFP4:
        raw[:, 0] = rng.integers(110, 141, raw.shape[0])  # 2^-18 .. 2^12 times the doubled e2m1 value
    for offset in SCALE_OFFSETS.get(qtype, ()):
        scale = np.exp2(rng.uniform(-20, -2, raw.shape[0])) * rng.choice([-1.0, 1.0], raw.shape[0])
        raw[:, offset : offset + 2] = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)  # F16/BF16/F32: every bit pattern, NaN and inf included


def assert_float16_within_one_ulp(got: np.ndarray, want: np.ndarray) -> None:
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.abs(got.astype(np.float32) - want.astype(np.float32)) <= np.spacing(np.abs(want)).astype(np.float32)
    bad = ~(same | close)
    assert not bad.any(), f"{bad.sum()} of {bad.size} float16 values off by more than 1 ulp, first at {np.argwhere(bad)[0]}"


@pytest.mark.parametrize("blocks", ["valid", "random bytes"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_reference(qtype: QT, shape: str, blocks: str) -> None:
    rows, row_length_of = SHAPES[shape]
    row_length = row_length_of(GGML_QUANT_SIZES[qtype][0])
    rng = np.random.default_rng([int(qtype), rows, row_length, int(blocks == "valid")])
    make = valid_blocks if blocks == "valid" else random_byte_blocks
    raw = make(rng, qtype, rows, row_length)
    with np.errstate(all="ignore"):  # random F16/BF16 bits hold NaN and inf
        want = dequantize_numpy(raw, qtype).reshape(rows, row_length)
        want16 = want.astype(np.float16)
    raw_gpu = cupy.asarray(raw)

    got = dequantize(raw_gpu, qtype, row_length)
    assert got.shape == (rows, row_length) and got.dtype == np.float32
    # Both compute the same products (and sums) in float32, so differences are reassociation only.
    np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-6, atol=1e-7)

    got16 = dequantize(raw_gpu, qtype, row_length, out_dtype=cupy.float16)
    assert got16.shape == (rows, row_length) and got16.dtype == np.float16
    assert_float16_within_one_ulp(cupy.asnumpy(got16), want16)


@pytest.mark.parametrize("qtype", GRID_QTYPES, ids=lambda t: t.name)
def test_grid_types_equal_gguf_bit_for_bit(qtype: QT) -> None:
    """blocks.cuh's decoders do gguf.quants' float32 operations in its order (checked on the host by
    test_quant_blocks_host.py), so the kernels' values are gguf's exactly, NaN and inf included."""
    rows, row_length = 33, 11008
    raw = random_byte_blocks(np.random.default_rng(int(qtype)), qtype, rows, row_length)
    with np.errstate(all="ignore"):
        want = dequantize_numpy(raw, qtype).reshape(rows, row_length).astype(np.float32)
    got = cupy.asnumpy(dequantize(cupy.asarray(raw), qtype, row_length))
    differ = (got.view(np.uint32) != want.view(np.uint32)) & ~(np.isnan(got) & np.isnan(want))
    assert not differ.any(), f"{differ.sum()} of {differ.size} values differ, first at {np.argwhere(differ)[0]}"


@pytest.mark.parametrize("out_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("qtype", GRID_QTYPES, ids=lambda t: t.name)
def test_gathered_grid_types_equal_dequantizing_each_expert(qtype: QT, out_dtype) -> None:
    """dequantize_gather (the prompt's expert path) reads experts at scattered addresses, in any order."""
    n_experts, rows, row_length = 5, 7, 768
    raw = random_grid_blocks(np.random.default_rng(int(qtype) + 1), qtype, (n_experts, rows, row_length))
    experts = cupy.asarray(raw.reshape(n_experts, -1))
    order = np.array([3, 0, 4, 3])  # repeats allowed
    ptrs = cupy.asarray(np.array([experts[e].data.ptr for e in order], dtype=np.uint64))
    got = cupy.asnumpy(dequantize_gather(ptrs, qtype, rows, row_length, out_dtype))
    want = dequantize_numpy(raw, qtype).reshape(n_experts, rows, row_length)[order].astype(out_dtype)
    assert got.shape == (len(order), rows, row_length) and got.dtype == out_dtype
    assert np.array_equal(got, want)


def test_every_listed_type_is_supported_and_no_other() -> None:
    assert SUPPORTED_QTYPES == frozenset(QTYPES)


def test_unsupported_type_is_a_value_error_naming_it() -> None:
    raw = cupy.zeros((1, GGML_QUANT_SIZES[QT.Q8_1][1]), dtype=cupy.uint8)
    with pytest.raises(ValueError, match="Q8_1"):
        dequantize(raw, QT.Q8_1, 32)


@pytest.mark.parametrize(
    "raw, row_length, out_dtype, message",
    [
        (lambda: cupy.zeros((2, 36), cupy.int8), 64, np.float32, "uint8"),
        (lambda: cupy.zeros((72,), cupy.uint8), 64, np.float32, "2-D"),
        (lambda: cupy.zeros((2, 72), cupy.uint8)[:, :36], 64, np.float32, "contiguous"),
        (lambda: cupy.zeros((2, 34), cupy.uint8), 64, np.float32, "take 36 bytes"),
        (lambda: cupy.zeros((2, 36), cupy.uint8), 48, np.float32, "block size 32"),
        (lambda: cupy.zeros((2, 36), cupy.uint8), 64, np.float64, "float32 or float16"),
    ],
    ids=["dtype", "ndim", "strided", "row-bytes", "row-length", "out-dtype"],
)
def test_wrapper_rejects_bad_arguments(raw, row_length: int, out_dtype, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        dequantize(raw(), QT.Q4_0, row_length, out_dtype=out_dtype)


def test_zero_rows_give_an_empty_array() -> None:
    out = dequantize(cupy.zeros((0, 210), cupy.uint8), QT.Q6_K, 256, out_dtype=cupy.float16)
    assert out.shape == (0, 256) and out.dtype == np.float16


def test_module_is_compiled_once() -> None:
    assert load_module("dequant") is load_module("dequant")
