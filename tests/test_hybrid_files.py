"""Synthesized qwen35moe / qwen3next files (runner synth): llama.cpp loads them, and the runner reads the
same layer layout, Gated DeltaNet shape and tensors from them; the full-size presets have the published
models' parameter counts."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from gguf import GGUFValueType
from gguf_edit import DROP, Typed, rewrite_gguf

from runner.cli.info import format_info, model_info
from runner.engine.engine import Engine, EngineConfig
from runner.errors import ModelFileError
from runner.gguf_file import open_gguf
from runner.models.config import model_config
from runner.models.delta_net_weights import DeltaNetWeights
from runner.models.weights import AttentionWeights, load_weights
from runner.parity.llama_oracle import LlamaOracle
from runner.synth.presets import PRESETS
from runner.synth.writer import tensor_plan


@pytest.mark.parametrize(("arch", "preset", "order"), [
    ("qwen35moe", "tiny", "tiled"), ("qwen3next", "tiny", "grouped"), ("qwen3next", "tiny-ssm-in", "grouped"),
])
def test_tiny_hybrid_loads_in_llama_cpp_and_reads_as_three_delta_net_layers_and_one_attention(
        synth_model, arch: str, preset: str, order: str) -> None:
    path = synth_model(arch, preset=preset)
    with LlamaOracle(path, n_ctx=32) as oracle:
        assert oracle.n_vocab == 512
    f = open_gguf(path)
    cfg = model_config(f)
    assert cfg.delta_net is not None
    assert cfg.delta_net.recurrent == (True, True, True, False)  # full_attention_interval 4
    assert (cfg.delta_net.n_k_heads, cfg.delta_net.n_v_heads, cfg.delta_net.head_dim) == (2, 4, 64)
    assert cfg.delta_net.value_heads == order
    assert (cfg.n_nextn, cfg.n_ff_shexp) == (1, 256)
    assert cfg.rope_sections == ((2, 2, 0, 0) if arch == "qwen35moe" else None)
    weights = load_weights(f, cfg)  # every tensor in the file is used, none missing
    kinds = [type(layer.attn) for layer in weights.layers]
    assert kinds == [DeltaNetWeights, DeltaNetWeights, DeltaNetWeights, AttentionWeights]
    assert isinstance(weights.nextn[0].layer.attn, AttentionWeights)
    delta = weights.layers[0].attn
    assert (delta.qkvz is not None) == (preset == "tiny-ssm-in")
    assert (delta.beta_alpha is not None) == (arch == "qwen3next")
    assert weights.layers[0].ffn.shared_gate is not None
    assert weights.nextn[0].embed is weights.token_embd  # Qwen's MTP block shares the embedding and head


@pytest.mark.parametrize(("arch", "preset", "total_b", "active_b"), [
    ("qwen35moe", "qwen35-35b-a3b", 35, 3),
    ("qwen35moe", "qwen35-397b-a17b", 397, 17),
    ("qwen3next", "qwen3next-80b-a3b", 80, 3),
])
def test_full_size_hybrid_presets_have_the_published_parameter_counts(arch: str, preset: str, total_b: float,
                                                                        active_b: float) -> None:
    shape = PRESETS[arch][preset]
    trunk = [t for t in tensor_plan(arch, shape) if not t.name.startswith(f"blk.{shape.n_layer}.")]
    total = sum(math.prod(t.shape) for t in trunk)
    routed = sum(math.prod(t.shape) for t in trunk if "_exps" in t.name)
    active = total - routed + routed * shape.n_expert_used / shape.n_expert
    assert total == pytest.approx(total_b * 1e9, rel=0.03)
    assert active_b * 1e9 <= active < (active_b + 1) * 1e9  # "A3B" rounds 3.45B down, as the names do


@pytest.mark.parametrize(("arch", "wrong"), [
    ("qwen35moe", {"value_heads": "grouped"}),
    ("qwen3next", {"value_heads": "tiled"}),
    ("qwen35moe", {"rope_sections": (2, 2, 2, 0)}),  # every rotary pair turned by the position
])
def test_a_wrong_head_order_or_section_layout_misses_llama_cpp_far_outside_tolerance(synth_model, arch: str,
                                                                                       wrong: dict) -> None:
    """The parity tests can tell: read as llama.cpp reads it the file matches within 2e-3 (test_llama_parity's
    F32 tolerance), read with the other family's value-head order or another rotary layout it is off by
    more than 25 times that (measured: 12-13 logits for the order; 0.1 for the sections, in one attention
    layer of four)."""
    path = synth_model(arch)
    tokens = [5, 70, 300, 12, 99, 400, 31, 7, 250, 61]
    with LlamaOracle(path, n_ctx=32) as oracle:
        want = oracle.logits(tokens)
    engine = Engine.load(path, EngineConfig(n_ctx=32))
    np.testing.assert_allclose(engine.logits_all(tokens), want, atol=2e-3)
    cfg = engine.model.cfg
    if "value_heads" in wrong:
        cfg = dataclasses.replace(cfg, delta_net=dataclasses.replace(cfg.delta_net, **wrong))
    else:
        cfg = dataclasses.replace(cfg, **wrong)
    engine.model.cfg = cfg
    assert np.abs(engine.logits_all(tokens) - want).max() > 25 * 2e-3


def test_runner_info_describes_the_layer_mix(synth_model) -> None:
    text = format_info(model_info(open_gguf(synth_model("qwen3next"))))
    assert "delta net     3 of 4 layers (the rest gated attention), 2 key / 4 value heads (grouped) of 64" in text


@pytest.mark.parametrize("item", [GGUFValueType.BOOL, GGUFValueType.UINT32])
def test_recurrent_layers_given_as_an_array_read_as_llama_cpp_reads_them(synth_model, tmp_path, item) -> None:
    """attention.recurrent_layers (what convert writes from layer_types) instead of full_attention_interval."""
    src = synth_model("qwen3next")
    flags = Typed([True, True, True, False, False] if item == GGUFValueType.BOOL else [1, 1, 1, 0, 0],
                  GGUFValueType.ARRAY, item)
    path = rewrite_gguf(src, tmp_path / "layers.gguf", {"qwen3next.attention.recurrent_layers": flags,
                                                        "qwen3next.full_attention_interval": DROP})
    assert model_config(open_gguf(path)).delta_net.recurrent == (True, True, True, False)
    tokens = [5, 70, 300, 12]
    with LlamaOracle(path, n_ctx=16) as oracle:
        want = oracle.logits(tokens)
    np.testing.assert_allclose(Engine.load(path, EngineConfig(n_ctx=16)).logits_all(tokens), want, atol=2e-3)
    nextn_recurrent = rewrite_gguf(src, tmp_path / "bad.gguf", {"qwen3next.attention.recurrent_layers": Typed(
        [True, True, True, False, True], GGUFValueType.ARRAY, GGUFValueType.BOOL)})
    with pytest.raises(ModelFileError, match="marks a NextN block recurrent"):
        model_config(open_gguf(nextn_recurrent))
