"""Tensor layouts llama.cpp's loaders accept beside the usual one, as `runner synth --preset tiny-fused`
writes them: q, k, v fused as attn_qkv (every family; the bias fused or the three kept apart), routed
gate and up experts fused as ffn_gate_up_exps (the hybrid families only), expert_feed_forward_length as
an array of one width per block. The runner reads each as llama.cpp does (its logits and greedy tokens),
and refuses what llama.cpp refuses."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType
from gguf_edit import DROP, Typed, rewrite_gguf
from test_llama_parity import (
    F32_TOLERANCE,
    MIN_ARGMAX_AGREEMENT,
    NEAR_TIE,
    compare,
    top2_margin,
)

from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.errors import ModelFileError
from runner.gguf_file import open_gguf
from runner.models.config import FAMILIES, model_config
from runner.models.weights import load_weights
from runner.offload.host_store import HostExpertStore
from runner.offload.offload import OffloadConfig
from runner.parity.llama_oracle import LlamaOracle
from runner.synth.presets import PRESETS
from runner.synth.writer import write_synthetic

ARCHS = ["glm4moe", "qwen3moe", "qwen35moe", "qwen3next"]
HYBRIDS = ["qwen35moe", "qwen3next"]
TOKENS = [5, 70, 300, 12, 99, 400, 31, 7, 250, 61]


def _write(path: Path, arch: str, preset: str = "tiny", **changes: object) -> Path:
    """An F32 file of the preset's shape with `changes` (SynthShape fields)."""
    write_synthetic(path, arch, dataclasses.replace(PRESETS[arch][preset], **changes), lambda t: QT.F32, seed=3)
    return path


def _logits_match_llama_cpp(path: Path, tokens: list[int] = TOKENS) -> np.ndarray:
    """The F32 bar of test_llama_parity.py, with f32 K/V caches on both sides."""
    with LlamaOracle(path, n_ctx=32, kv_type="f32") as oracle:
        want = oracle.logits(tokens)
    got = Engine.load(path, EngineConfig(n_ctx=32, ubatch=4), ops=NumpyOps(kv_type="f32")).logits_all(tokens)
    np.testing.assert_allclose(got, want, atol=F32_TOLERANCE)
    return got


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_layouts_give_llama_cpp_s_logits_and_greedy_tokens(synth_model, arch: str, record_property) -> None:
    path = synth_model(arch, preset="tiny-fused")
    f = open_gguf(path)
    cfg = model_config(f)
    last = cfg.n_layer - 1  # an attention layer in every family (the hybrids' fourth)
    assert f"blk.{last}.attn_qkv.weight" in f.tensors and f"blk.{last}.attn_q.weight" not in f.tensors
    assert (f"blk.{last}.ffn_gate_up_exps.weight" in f.tensors) == FAMILIES[arch].fused_gate_up
    assert f.value_types[f"{arch}.expert_feed_forward_length"].item == GGUFValueType.INT32
    got_logits, want_logits, got_tokens, want_tokens = compare(arch, path, record_property)
    assert float(np.abs(got_logits - want_logits).max()) <= F32_TOLERANCE
    assert got_tokens == want_tokens


@pytest.mark.parametrize("arch", HYBRIDS)
def test_a_quantized_fused_hybrid_matches_llama_cpp_teacher_forced(synth_model, arch: str, record_property) -> None:
    """llama.cpp's quantizer types the fused tensors as one (its own rule for attn_qkv); the bar is
    test_llama_parity's for quantized hybrids."""
    got_logits, want_logits, _, _ = compare(arch, synth_model(arch, "Q4_K_M", preset="tiny-fused"), record_property)
    deviation = np.abs(got_logits - want_logits).max(axis=-1)
    assert float(np.median(deviation)) <= 0.1 * float(np.std(want_logits))
    agree = got_logits.argmax(-1) == want_logits.argmax(-1)
    assert agree.mean() >= MIN_ARGMAX_AGREEMENT[arch]
    clear = (top2_margin(want_logits) >= NEAR_TIE) & (deviation < NEAR_TIE)
    assert agree[clear].all()


@pytest.mark.parametrize("arch", HYBRIDS)
def test_fused_gate_up_experts_are_views_the_host_arena_copies_and_offload_runs(synth_model, arch: str) -> None:
    """The gate and up views share the file's bytes (per expert: its gate rows, then its up rows); the host
    expert arena holds each expert's rows contiguously, so expert offload gives the resident engine's logits."""
    path = synth_model(arch, "Q8_0", preset="tiny-fused")
    f = open_gguf(path)
    cfg = model_config(f)
    w = load_weights(f, cfg).layers[0].ffn
    fused = f.tensors["blk.0.ffn_gate_up_exps.weight"]
    assert (w.gate_exps.name, w.up_exps.name) == ("blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight")
    assert w.gate_exps.shape == w.up_exps.shape == (cfg.n_expert, cfg.n_ff_exp, cfg.n_embd)
    assert np.shares_memory(w.gate_exps.data, fused.data) and np.shares_memory(w.up_exps.data, fused.data)
    np.testing.assert_array_equal(w.up_exps.data[5], fused.data[5, cfg.n_ff_exp :])
    store = HostExpertStore(load_weights(f, cfg))
    m = store.matrices(0, 5)
    np.testing.assert_array_equal(m.up, fused.data[5, cfg.n_ff_exp :].reshape(m.up.shape))
    resident = Engine.load(path, EngineConfig(n_ctx=64, ubatch=8))
    offload = OffloadConfig(cache_slots=3, prefill_ubatch=8, transaction="always")
    offloaded = Engine.load(path, EngineConfig(n_ctx=64, ubatch=8, offload=offload))
    tokens = list(range(50, 80))
    np.testing.assert_array_equal(offloaded.logits_all(tokens), resident.logits_all(tokens))


@pytest.mark.parametrize("arch", ["glm4moe", "qwen3moe"])
def test_a_fused_gate_up_in_a_family_whose_llama_cpp_loader_reads_none_is_refused(tmp_path, arch: str) -> None:
    path = _write(tmp_path / "fused.gguf", arch, fused_gate_up=True)
    with pytest.raises(ModelFileError):
        LlamaOracle(path, n_ctx=16)
    with pytest.raises(ModelFileError, match=rf"'blk\.\d\.ffn_gate_up_exps\.weight': {arch} files keep the gate"):
        Engine.load(path, EngineConfig(n_ctx=16))


@pytest.mark.parametrize("fused", [False, True])
def test_gated_attention_adds_its_q_k_v_biases_as_llama_cpp_does(tmp_path, fused: bool) -> None:
    """A hybrid's q bias covers the query and its output gate (2 q_dim rows), apart or in attn_qkv.bias;
    the runner used to read the biases and leave them out of the sum."""
    path = _write(tmp_path / "bias.gguf", "qwen35moe", qkv_bias=True, fused_qkv=fused)
    assert load_weights(open_gguf(path), model_config(open_gguf(path))).layers[3].attn.bq.shape == (2 * 4 * 64,)
    _logits_match_llama_cpp(path)


def test_biases_kept_apart_beside_a_fused_weight_count_only_when_all_three_are_there(tmp_path) -> None:
    """llama.cpp's build_qkv adds attn_q/k/v.bias to a fused attn_qkv only as a set; two of three load and do nothing."""
    src = _write(tmp_path / "glm.gguf", "glm4moe", fused_qkv=True)  # qkv_bias: attn_qkv.bias

    def apart(keep: str):
        def edit(name: str, qtype, data):
            if not name.endswith("attn_qkv.bias"):
                return name, qtype, data
            q, kv = 4 * 64, 2 * 64
            parts = {"q": data[:q], "k": data[q : q + kv], "v": data[q + kv :]}
            return [(name.replace("qkv", x), qtype, parts[x]) for x in keep]
        return edit

    with_all = _logits_match_llama_cpp(rewrite_gguf(src, tmp_path / "all.gguf", tensor_edit=apart("qkv")))
    f32 = NumpyOps(kv_type="f32")  # the K/V cache _logits_match_llama_cpp's logits came from
    config = EngineConfig(n_ctx=32, ubatch=4)
    np.testing.assert_array_equal(with_all, Engine.load(src, config, ops=f32).logits_all(TOKENS))
    two = _logits_match_llama_cpp(rewrite_gguf(src, tmp_path / "two.gguf", tensor_edit=apart("qk")))
    none = rewrite_gguf(src, tmp_path / "none.gguf", tensor_edit=apart(""))
    np.testing.assert_array_equal(two, Engine.load(none, config, ops=f32).logits_all(TOKENS))


def test_every_layer_is_sized_by_the_first_entry_of_a_per_block_expert_width(synth_model, tmp_path) -> None:
    """llama.cpp's loaders size every layer's experts by n_ff_exp() (the first entry): later entries that
    differ change nothing there, so nothing here; an array of the wrong length is refused by both."""
    src = synth_model("qwen3next", preset="tiny-fused")
    key = "qwen3next.expert_feed_forward_length"
    widths = rewrite_gguf(src, tmp_path / "widths.gguf",
                          {key: Typed([256, 128, 128, 64, 64], GGUFValueType.ARRAY, GGUFValueType.UINT32)})
    assert model_config(open_gguf(widths)).n_ff_exp == 256
    _logits_match_llama_cpp(widths)
    short = rewrite_gguf(src, tmp_path / "short.gguf", {key: Typed([256] * 4, GGUFValueType.ARRAY, GGUFValueType.INT32)})
    with pytest.raises(ModelFileError):
        LlamaOracle(short, n_ctx=16)
    with pytest.raises(ModelFileError, match="expert_feed_forward_length' must have 5 items"):
        model_config(open_gguf(short))


@pytest.mark.parametrize(("arch", "loads"), [("qwen3moe", True), ("qwen3next", True), ("glm4moe", False)])
def test_without_an_expert_width_the_experts_are_feed_forward_length_over_the_experts_used(
        synth_model, tmp_path, arch: str, loads: bool) -> None:
    """llama.cpp: n_ff_exp() ? n_ff_exp() : n_ff / n_expert_used, where the key is optional (not glm4moe's)."""
    src = synth_model(arch)
    shape = PRESETS[arch]["tiny"]
    path = rewrite_gguf(src, tmp_path / "no-width.gguf", {
        f"{arch}.expert_feed_forward_length": DROP,
        f"{arch}.feed_forward_length": shape.n_ff_exp * shape.n_expert_used,
    })
    if not loads:
        with pytest.raises(ModelFileError):
            LlamaOracle(path, n_ctx=16)
        with pytest.raises(ModelFileError, match="expert_feed_forward_length' is missing"):
            model_config(open_gguf(path))
        return
    assert model_config(open_gguf(path)).n_ff_exp == shape.n_ff_exp
    _logits_match_llama_cpp(path)


def test_a_qwen3next_layer_with_a_dense_ffn_is_refused_as_llama_cpp_refuses_it(synth_model, tmp_path) -> None:
    """qwen3next's graph has a dense-FFN branch, but its loader requires the router and experts in every
    layer, so no file reaches it: a layer with ffn_gate/ffn_up/ffn_down instead does not load."""
    src = synth_model("qwen3next")
    moe = ("ffn_gate_inp.", "ffn_gate_exps.", "ffn_up_exps.", "ffn_down_exps.", "ffn_gate_inp_shexp.",
           "ffn_gate_shexp.", "ffn_up_shexp.", "ffn_down_shexp.")

    def dense(name: str, qtype, data):
        if not name.startswith("blk.1.ffn_"):
            return name, qtype, data
        if name == "blk.1.ffn_gate_inp.weight":
            rng = np.random.default_rng(0)
            return [(f"blk.1.ffn_{x}.weight", QT.F32, (rng.standard_normal(shape) / 16).astype(np.float32))
                    for x, shape in (("gate", (256, 256)), ("up", (256, 256)), ("down", (256, 256)))]
        return None if name.startswith(tuple("blk.1." + m for m in moe)) else (name, qtype, data)

    path = rewrite_gguf(src, tmp_path / "dense.gguf", tensor_edit=dense)
    assert "blk.1.ffn_up.weight" in open_gguf(path).tensors and "blk.1.ffn_gate_inp.weight" not in open_gguf(path).tensors
    with pytest.raises(ModelFileError):
        LlamaOracle(path, n_ctx=16)
    with pytest.raises(ModelFileError, match="required tensor 'blk.1.ffn_gate_inp.weight' is missing"):
        Engine.load(path, EngineConfig(n_ctx=16))
