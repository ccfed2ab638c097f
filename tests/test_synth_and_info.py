"""runner synth writes loadable, deterministic files; runner info's byte figures add up."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest

from runner.cli.info import model_info
from runner.engine.engine import Engine, EngineConfig
from runner.errors import SynthError
from runner.gguf_file import open_gguf
from runner.models.weights import is_routed_expert
from runner.parity.llama_oracle import LlamaOracle
from runner.synth import synthesize, tensor_plan
from runner.synth.mixes import mix_qtype
from runner.synth.presets import PRESETS, resolve_shape
from runner.synth.writer import write_synthetic


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_file_other_seed_other_weights(tmp_path: Path) -> None:
    a = synthesize(tmp_path / "a.gguf", "qwen3moe", "tiny", "Q8_0", seed=3).path
    b = synthesize(tmp_path / "b.gguf", "qwen3moe", "tiny", "Q8_0", seed=3).path
    c = synthesize(tmp_path / "c.gguf", "qwen3moe", "tiny", "Q8_0", seed=4).path
    assert digest(a) == digest(b) != digest(c)


@pytest.mark.parametrize("quant,direct", [("Q4_K_M", True), ("F16", False)])
def test_drawing_tensors_in_worker_processes_writes_the_same_file(tmp_path: Path, quant: str, direct: bool) -> None:
    one = synthesize(tmp_path / "one.gguf", "glm4moe", "small", quant, seed=5, direct=direct).path
    three = synthesize(tmp_path / "three.gguf", "glm4moe", "small", quant, seed=5, direct=direct, jobs=3).path
    assert digest(one) == digest(three)


def test_tensors_written_at_their_offsets_read_back_as_drawn(tmp_path: Path) -> None:
    """Each process writes its tensor where the tensor info points: gguf's own reader finds every tensor's bytes
    equal to its draw, zeros in the padding, and the file ending at the last tensor's padded end."""
    import gguf

    from runner.synth.writer import _draw_one

    shape = dataclasses.replace(PRESETS["glm4moe"]["tiny"], full_size=True)
    path = tmp_path / "offsets.gguf"
    n_all = shape.n_layer + shape.n_nextn
    qtype_of = lambda t: mix_qtype("Q4_K_M", t.name, n_all, shape=t.shape)  # noqa: E731
    write_synthetic(path, "glm4moe", shape, qtype_of, seed=2, jobs=2)
    reader = gguf.GGUFReader(path)
    plan = tensor_plan("glm4moe", shape)
    assert [t.name for t in reader.tensors] == [t.name for t in plan]
    raw = np.fromfile(path, dtype=np.uint8)
    covered = np.zeros(raw.size, dtype=bool)
    for index, (t, info) in enumerate(zip(plan, reader.tensors)):
        want = np.ascontiguousarray(_draw_one((2, index, t, qtype_of(t), True))).reshape(-1).view(np.uint8)
        got = raw[info.data_offset : info.data_offset + want.size]
        assert np.array_equal(got, want), t.name
        covered[info.data_offset : info.data_offset + want.size] = True
    last = reader.tensors[-1]
    assert raw.size == reader.tensors[0].data_offset + sum(
        gguf.GGUFWriter.ggml_pad(int(i.n_bytes), reader.alignment) for i in reader.tensors)
    assert raw.size - (last.data_offset + int(last.n_bytes)) < reader.alignment
    assert not raw[reader.tensors[0].data_offset :][~covered[reader.tensors[0].data_offset :]].any()  # zero padding


def test_layer_and_expert_overrides_shape_the_file(tmp_path: Path) -> None:
    path = synthesize(tmp_path / "m.gguf", "glm4moe", "tiny", layers=2, experts=4).path
    cfg = Engine.load(path).model_config
    assert (cfg.n_layer, cfg.n_expert, cfg.n_nextn, cfg.n_dense_lead) == (2, 4, 1, 1)


def test_full_size_writer_streams_quant_blocks_llama_cpp_loads(tmp_path: Path) -> None:
    """The direct random-block path (used for glm45-air and friends) on a shape small enough to run."""
    shape = dataclasses.replace(PRESETS["glm4moe"]["tiny"], full_size=True)
    path = tmp_path / "direct.gguf"
    n_all = shape.n_layer + shape.n_nextn
    write_synthetic(path, "glm4moe", shape, lambda t: mix_qtype("Q4_K_M", t.name, n_all, shape=t.shape), seed=1)
    f = open_gguf(path)
    assert f.tensor("blk.1.ffn_gate_exps.weight").qtype.name == "Q4_K"
    assert f.tensor("blk.1.ffn_gate_inp.weight").qtype.name == "F32"
    engine = Engine.load(path, EngineConfig(n_ctx=64))
    prompt = engine.tokenizer.encode("direct blocks")
    with LlamaOracle(path, n_ctx=64) as oracle:
        want = oracle.logits(prompt)
    got = engine.logits_all(prompt)
    assert np.isfinite(got).all() and got.std() > 1.0
    assert np.median(np.abs(got - want).max(axis=-1)) < 0.1 * want.std()


def test_full_size_presets_refuse_float_round_trip_types(tmp_path: Path) -> None:
    with pytest.raises(SynthError, match="full-size presets write quant blocks directly"):
        synthesize(tmp_path / "x.gguf", "glm4moe", "glm45-air", "Q4_K_XL")


def test_unknown_preset_and_quant_are_named(tmp_path: Path) -> None:
    with pytest.raises(SynthError, match="unknown preset 'huge' for glm4moe"):
        resolve_shape("glm4moe", "huge")
    with pytest.raises(SynthError, match="unknown quant type 'Q9_Z'"):
        synthesize(tmp_path / "x.gguf", "glm4moe", "tiny", "Q9_Z")


def test_published_shapes_are_mirrored() -> None:
    air = PRESETS["glm4moe"]["glm45-air"]
    assert (air.n_layer, air.n_nextn, air.n_embd, air.n_head, air.n_head_kv, air.head_dim) == (46, 1, 4096, 96, 8, 128)
    assert (air.n_expert, air.n_ff_exp, air.n_expert_used, air.n_expert_shared, air.n_dense_lead) == (128, 1408, 8, 1, 1)
    qwen = PRESETS["qwen3moe"]["qwen3-30b-a3b"]
    assert (qwen.n_layer, qwen.n_embd, qwen.n_head, qwen.n_head_kv, qwen.n_expert, qwen.n_ff_exp) == (48, 2048, 32, 4, 128, 768)
    seed = PRESETS["glm4moe"]["seed"]
    assert (seed.n_layer, seed.n_embd, seed.n_expert, seed.n_ff_exp, seed.n_expert_used) == (48, 2048, 512, 512, 10)
    names = {t.name for t in tensor_plan("glm4moe", air)}
    assert "blk.46.nextn.eh_proj.weight" in names and "blk.0.ffn_gate.weight" in names


def test_info_byte_figures_add_up(synth_model) -> None:
    f = open_gguf(synth_model("glm4moe", "Q4_K_M"))
    info = model_info(f)
    routed = [t for t in f.tensors.values() if is_routed_expert(t.name)]
    assert info.routed_expert_bytes == sum(t.nbytes for t in routed)
    assert info.resident_bytes + info.routed_expert_bytes == info.tensor_bytes
    assert sum(info.routed_expert_bytes_per_layer.values()) == info.routed_expert_bytes
    assert sorted(info.routed_expert_bytes_per_layer) == [1, 2, 3]  # MoE layers incl. the NextN block
    per_expert = [t.nbytes // t.shape[0] for t in routed]
    assert info.expert_slot_bytes == max(sum(per_expert[i:i + 3]) for i in range(0, len(per_expert), 3))
    assert sum(v["bytes"] for v in info.quant_mix.values()) == info.tensor_bytes
