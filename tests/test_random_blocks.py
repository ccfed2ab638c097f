"""Random quant blocks: valid layout, weight-like statistics, determinism; llama.cpp-style type mixes."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

from runner.errors import SynthError
from runner.synth.mixes import MIX_NAMES, mix_qtype
from runner.synth.random_blocks import DIRECT_QTYPES, random_tensor

TYPES = sorted(DIRECT_QTYPES, key=lambda t: t.value)
STATS_SHAPE = (128, 4096)  # 2048 blocks of 256, 16384 blocks of 32


def _nbytes(shape: tuple[int, ...], qt: QT) -> int:
    block, type_size = gguf.GGML_QUANT_SIZES[qt]
    return math.prod(shape) // block * type_size


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_shape_dtype_and_size(qt: QT) -> None:
    shape = (3, 16, 512)  # experts, rows, row length
    data = random_tensor(np.random.default_rng(0), qt, shape, 0.02)
    if qt in (QT.F32, QT.F16):
        assert data.shape == shape and data.dtype == (np.float32 if qt == QT.F32 else np.float16)
    else:
        assert data.dtype == np.uint8
        assert data.shape == gguf.quants.quant_shape_to_byte_shape(shape, qt)
    assert data.nbytes == _nbytes(shape, qt)
    assert dequantize(data, qt).shape == shape


@pytest.mark.parametrize("std", [0.01, 1.0])
@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_dequantized_statistics(qt: QT, std: float) -> None:
    values = dequantize(random_tensor(np.random.default_rng(1), qt, STATS_SHAPE, std), qt).astype(np.float64)
    assert np.isfinite(values).all()
    assert abs(values.mean()) < 0.1 * std
    assert 0.75 * std < values.std() < 1.25 * std
    assert np.unique(values[:8]).size > 1  # not a constant pattern row to row


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_deterministic_per_seed(qt: QT) -> None:
    draw = lambda seed: random_tensor(np.random.default_rng(seed), qt, (8, 1024), 0.02)  # noqa: E731
    assert np.array_equal(draw(7), draw(7))
    assert not np.array_equal(draw(7), draw(8))


def test_gguf_round_trip(tmp_path) -> None:
    # The arrays go straight into GGUFWriter.add_tensor(raw_dtype=...) and read back unchanged.
    path = tmp_path / "blocks.gguf"
    shape = (2, 4, 256)
    writer = gguf.GGUFWriter(path, "llama")
    arrays = {qt: random_tensor(np.random.default_rng(2), qt, shape, 0.02) for qt in TYPES}
    for qt, data in arrays.items():
        writer.add_tensor(f"t.{qt.name}", data, raw_dtype=qt)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    for qt, data in arrays.items():
        t = tensors[f"t.{qt.name}"]
        assert t.tensor_type == qt
        assert tuple(int(n) for n in reversed(t.shape)) == shape
        assert np.array_equal(np.asarray(t.data).view(np.uint8).ravel(), data.view(np.uint8).ravel())


@pytest.mark.parametrize(("qt", "row", "block"), [(QT.Q4_K, 1408, "256"), (QT.Q8_0, 100, "32"), (QT.MXFP4, 48, "32")])
def test_bad_row_length_raises(qt: QT, row: int, block: str) -> None:
    with pytest.raises(SynthError, match=rf"{qt.name}.*{block}"):
        random_tensor(np.random.default_rng(0), qt, (4, row), 0.02)


def test_unsupported_type_and_bad_std_raise() -> None:
    with pytest.raises(SynthError, match="IQ2_XXS"):
        random_tensor(np.random.default_rng(0), QT.IQ2_XXS, (4, 256), 0.02)
    with pytest.raises(SynthError, match="standard deviation"):
        random_tensor(np.random.default_rng(0), QT.Q4_K, (4, 256), 0.0)


def test_q4_k_m_rules() -> None:
    n = 46  # GLM-4.5-Air: use_more_bits picks layers 0-4, 7, 10, ..., 37 and 40-45
    mix = lambda name: mix_qtype("Q4_K_M", name, n)  # noqa: E731
    assert mix("blk.3.ffn_gate_inp.weight") == QT.F32
    assert mix("blk.3.exp_probs_b.bias") == QT.F32
    assert mix("blk.3.attn_norm.weight") == QT.F32
    assert mix("blk.3.attn_q.bias") == QT.F32
    assert mix("output_norm.weight") == QT.F32
    assert mix("output.weight") == QT.Q6_K
    assert mix("token_embd.weight") == QT.Q4_K
    assert [mix(f"blk.{i}.ffn_down_exps.weight") for i in (0, 4, 5, 6, 7, 10, 40, 45)] == [
        QT.Q6_K, QT.Q6_K, QT.Q4_K, QT.Q4_K, QT.Q6_K, QT.Q6_K, QT.Q6_K, QT.Q6_K,
    ]
    assert mix("blk.0.ffn_down.weight") == QT.Q6_K and mix("blk.5.ffn_down_shexp.weight") == QT.Q4_K
    assert mix("blk.1.attn_v.weight") == QT.Q6_K and mix("blk.6.attn_v.weight") == QT.Q4_K
    assert mix("blk.1.ffn_gate_exps.weight") == QT.Q4_K and mix("blk.1.attn_output.weight") == QT.Q4_K


def test_shape_fallback_and_other_mixes() -> None:
    # 1408-wide expert rows are not whole 256-blocks: llama.cpp stores Q4_K as Q5_0, Q6_K as Q8_0.
    down = (128, 4096, 1408)
    assert mix_qtype("Q4_K_M", "blk.5.ffn_down_exps.weight", 46, shape=down) == QT.Q5_0
    assert mix_qtype("Q4_K_M", "blk.0.ffn_down_exps.weight", 46, shape=down) == QT.Q8_0
    assert mix_qtype("Q4_K_M", "blk.5.attn_k.weight", 46, shape=(5,)) == QT.F32
    assert mix_qtype("f16", "blk.0.attn_q.weight", 4) == QT.F16
    assert mix_qtype("F16", "blk.0.attn_norm.weight", 4) == QT.F32
    assert mix_qtype("MXFP4", "blk.0.ffn_up_exps.weight", 4) == QT.MXFP4
    assert mix_qtype("MXFP4", "blk.0.attn_q.weight", 4) == QT.Q8_0
    assert mix_qtype("Q8_0", "output.weight", 4) == QT.Q8_0
    assert mix_qtype("Q2_K", "blk.0.ffn_down.weight", 4) == QT.Q3_K
    with pytest.raises(SynthError, match="Q4_K_M"):
        mix_qtype("Q4_K_X", "blk.0.attn_q.weight", 4)


@pytest.mark.parametrize("mix", MIX_NAMES)
def test_every_mix_is_drawable(mix: str) -> None:
    names = ["token_embd.weight", "output.weight", "output_norm.weight"] + [
        f"blk.{i}.{t}" for i in range(8) for t in (
            "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "attn_norm.weight",
            "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight",
        )
    ]
    for name in names:
        qt = mix_qtype(mix, name, 8, shape=(16, 1408))
        assert qt in DIRECT_QTYPES and 1408 % gguf.GGML_QUANT_SIZES[qt][0] == 0, (name, qt)
