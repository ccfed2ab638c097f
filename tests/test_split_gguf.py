"""Split GGUF (`model-00001-of-00003.gguf`, as llama.cpp's gguf-split writes it) loads as one model from
its first shard; a missing or mismatched shard is one line naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from runner.backends.numpy.ops import NumpyOps
from runner.cli.info import format_info, model_info
from runner.engine.engine import Engine, EngineConfig
from runner.engine.tokenizer import Tokenizer
from runner.errors import ModelFileError
from runner.gguf_file import open_gguf
from runner.models.config import model_config
from runner.models.weights import load_weights
from runner.offload.host_store import HostExpertStore
from runner.offload.provider import raw_expert
from runner.parity.llama_oracle import LlamaOracle

KEY_NO, KEY_COUNT, KEY_TENSORS = (gguf.Keys.Split.LLM_KV_SPLIT_NO, gguf.Keys.Split.LLM_KV_SPLIT_COUNT,
                                  gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)


def shard_name(prefix: str, number: int, count: int) -> str:
    return gguf.gguf_writer.SHARD_NAME_FORMAT.format(prefix, number, count)


def write_split(source: Path, folder: Path, count: int = 3, prefix: str = "model", *,
                split_no: dict[int, int] | None = None, split_count: dict[int, int] | None = None,
                tensors_count: int | None = None, duplicate: bool = False) -> list[Path]:
    """`source` rewritten as `count` shards the way gguf-split does it: all metadata in the first, the tensors
    dealt out in order, and on every shard split.no (0-based) and split.count, on the first split.tensors.count
    (UINT16, UINT16, INT32). The keyword arguments break one thing for the failure tests."""
    f = open_gguf(source)
    names = list(f.tensors)
    per = -(-len(names) // count)
    groups = [names[i * per:(i + 1) * per] for i in range(count)]
    if duplicate:  # the first shard's first tensor, again in the last
        groups[-1].append(groups[0][0])
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, group in enumerate(groups):
        path = folder / shard_name(prefix, index + 1, count)
        writer = gguf.GGUFWriter(path, f.architecture)
        writer.kv_data = [{}]  # no general.architecture on later shards; the first gets it from the copy
        if index == 0:
            for key, value in f.metadata.items():
                vtype = f.value_types[key]
                if vtype.item is not None and not isinstance(value, list):
                    value = list(value)
                writer.add_key_value(key, value, vtype.type, vtype.item)
            writer.add_key_value(KEY_TENSORS, sum(map(len, groups)) if tensors_count is None else tensors_count,
                                 gguf.GGUFValueType.INT32)
        writer.add_key_value(KEY_NO, (split_no or {}).get(index, index), gguf.GGUFValueType.UINT16)
        writer.add_key_value(KEY_COUNT, (split_count or {}).get(index, count), gguf.GGUFValueType.UINT16)
        for name in group:
            t = f.tensors[name]
            writer.add_tensor(name, np.ascontiguousarray(t.data), raw_dtype=t.qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def split_set(synth_model, tmp_path_factory):
    made: dict[tuple, tuple[Path, list[Path]]] = {}

    def make(arch: str, quant: str, count: int = 3) -> tuple[Path, list[Path]]:
        key = (arch, quant, count)
        if key not in made:
            source = synth_model(arch, quant)
            made[key] = source, write_split(source, tmp_path_factory.mktemp(f"split-{arch}-{quant}"), count)
        return made[key]

    return make


@pytest.mark.parametrize("arch,quant,count", [("glm4moe", "F32", 3), ("qwen3moe", "Q8_0", 2)])
def test_split_model_gives_the_single_files_logits_exactly(split_set, arch, quant, count) -> None:
    source, shards = split_set(arch, quant, count)
    split = open_gguf(shards[0])
    single = open_gguf(source)
    assert split.shards == tuple(shards) and set(split.tensors) == set(single.tensors)
    assert split.file_bytes == sum(p.stat().st_size for p in shards)
    engines = [Engine(f, EngineConfig(n_ctx=64), NumpyOps()) for f in (single, split)]
    tokens = engines[0].tokenizer.encode("Split files load as one model")
    assert engines[1].tokenizer.encode("Split files load as one model") == tokens
    want, got = (e.logits_all(tokens) for e in engines)
    assert np.array_equal(want, got)


def test_llama_cpp_loads_the_same_split_files(split_set) -> None:
    """The test shards are real split GGUFs: llama.cpp loads them (vocab_only too) and computes what it
    computes for the single file."""
    source, shards = split_set("glm4moe", "F32")
    with Tokenizer(shards[0]) as split_tok, Tokenizer(source) as single_tok:
        tokens = single_tok.encode("the vocabulary is in the first shard")
        assert split_tok.encode("the vocabulary is in the first shard") == tokens
    with LlamaOracle(source, n_ctx=64) as oracle:
        want = oracle.logits(tokens)
    with LlamaOracle(shards[0], n_ctx=64) as oracle:
        assert np.array_equal(oracle.logits(tokens), want)


def test_host_expert_store_reads_each_shards_own_mapping(split_set) -> None:
    _, shards = split_set("qwen3moe", "Q8_0", 2)
    f = open_gguf(shards[0])
    weights = load_weights(f, model_config(f))
    store = HostExpertStore(weights)
    for layer in store.layers:
        w = store.weights(layer)
        for e in (0, store.n_expert(layer) - 1):
            expected = np.concatenate([raw_expert(t, e).reshape(-1) for t in (w.gate_exps, w.up_exps, w.down_exps)])
            assert np.array_equal(store.experts(layer, e), expected)
    in_second = {t.name for t in gguf.GGUFReader(shards[1]).tensors}
    assert any(t.name in in_second for t in (w.gate_exps, w.up_exps, w.down_exps))  # experts from the 2nd shard


def test_info_reports_the_shards_and_their_total(split_set) -> None:
    _, shards = split_set("glm4moe", "F32")
    total = sum(p.stat().st_size for p in shards)
    info = model_info(open_gguf(shards[0]))
    assert (info.shards, info.file_bytes) == (3, total)
    assert "3 shards" in format_info(info).splitlines()[0]
    out = subprocess.run([sys.executable, "-m", "runner.cli", "info", str(shards[0]), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["shards"], data["file_bytes"], data["file"]) == (3, total, str(shards[0]))


def test_a_single_file_is_one_shard(synth_model) -> None:
    path = synth_model("glm4moe")
    f = open_gguf(path)
    assert f.shards == (path,) and model_info(f).shards == 1 and f.file_bytes == path.stat().st_size


def refusal(path: Path) -> str:
    with pytest.raises(ModelFileError) as err:
        open_gguf(path)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_later_shard_is_refused_naming_the_first(split_set) -> None:
    _, shards = split_set("glm4moe", "F32")
    message = refusal(shards[1])
    assert message.startswith("model-00002-of-00003.gguf: is shard 2 of 3") and "model-00001-of-00003.gguf" in message


def test_missing_shard(synth_model, tmp_path) -> None:
    shards = write_split(synth_model("glm4moe"), tmp_path)
    shards[1].unlink()
    assert refusal(shards[0]) == "model-00002-of-00003.gguf: missing (shard 2 of 3)"


@pytest.mark.parametrize("broken,expected", [
    (dict(split_no={1: 2}), "model-00002-of-00003.gguf: split.no 2, expected 1"),
    (dict(split_count={2: 4}), "model-00003-of-00003.gguf: split.count 4, expected 3 (as in model-00001-of-00003.gguf)"),
    (dict(tensors_count=5), "model-00001-of-00003.gguf: split.tensors.count 5, but the 3 shards hold"),
    (dict(duplicate=True), "model-00003-of-00003.gguf: tensor 'token_embd.weight' is also in model-00001-of-00003.gguf"),
])
def test_each_mismatch_is_one_line_naming_the_shard(synth_model, tmp_path, broken, expected) -> None:
    shards = write_split(synth_model("glm4moe"), tmp_path, **broken)
    assert refusal(shards[0]).startswith(expected)


def test_split_keys_on_a_file_named_like_a_single_one(synth_model, tmp_path) -> None:
    shards = write_split(synth_model("glm4moe"), tmp_path, count=2)
    renamed = shards[0].rename(tmp_path / "model.gguf")
    assert "the name does not end in -00001-of-00002.gguf" in refusal(renamed)


def test_a_shard_name_without_split_keys(synth_model, tmp_path) -> None:
    named = tmp_path / "model-00001-of-00002.gguf"
    named.write_bytes(synth_model("glm4moe").read_bytes())
    assert "metadata key 'split.count' is missing" in refusal(named)
