"""A NextN block tied to the trunk's embedding and head, as the trained demo model is exported.

scripts/demo/export_demo.py leaves out blk.N.nextn.embed_tokens and blk.N.nextn.shared_head_head (training
shared them with token_embd and output). The runner must then use the trunk's tensors, which is the
same model as a file carrying copies of them, and llama.cpp must load the file and agree.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf_edit import rewrite_gguf

from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.parity.llama_oracle import LlamaOracle

TIED = ("nextn.embed_tokens.weight", "nextn.shared_head_head.weight")
TOKENS = [17, 301, 5, 444, 88, 250, 61, 499, 3, 120]


def _trunk_tensors(path: Path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in GGUFReader(path).tensors if t.name in ("token_embd.weight", "output.weight")}


@pytest.fixture(scope="module")
def files(synth_model, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(tied: the two tensors left out, copied: the two tensors replaced by the trunk's)."""
    src = synth_model("glm4moe", "F32", seed=7)
    trunk = _trunk_tensors(src)
    folder = tmp_path_factory.mktemp("tied")
    tied = rewrite_gguf(src, folder / "tied.gguf", tensor_edit=lambda n, q, d: None if n.endswith(TIED) else (n, q, d))

    def copy_trunk(name, qtype, data):
        if name.endswith(TIED[0]):
            return name, qtype, trunk["token_embd.weight"]
        if name.endswith(TIED[1]):
            return name, qtype, trunk["output.weight"]
        return name, qtype, data

    return tied, rewrite_gguf(src, folder / "copied.gguf", tensor_edit=copy_trunk)


def _nextn_logits(path: Path) -> np.ndarray:
    engine = Engine.load(path, EngineConfig(n_ctx=64))
    _, hidden = engine.model.forward(np.asarray(TOKENS), engine.model.new_kv_cache(64))
    block = engine.nextn[0]
    logits, _ = block.forward(hidden[:-1], np.asarray(TOKENS[1:]), block.new_kv_cache(64))
    return np.asarray(logits)


def test_nextn_without_its_own_embedding_and_head_uses_the_trunks(files) -> None:
    tied, copied = files
    engine = Engine.load(tied, EngineConfig(n_ctx=64))
    assert engine.nextn[0].weights.embed is engine.model.weights.token_embd
    assert engine.nextn[0].weights.head is engine.model.weights.output
    np.testing.assert_array_equal(_nextn_logits(tied), _nextn_logits(copied))


def test_llama_cpp_loads_the_tied_file_and_agrees_with_the_runner(files) -> None:
    tied, _ = files
    got = Engine.load(tied, EngineConfig(n_ctx=64), ops=NumpyOps(kv_type="f32")).logits_all(TOKENS)
    with LlamaOracle(tied, n_ctx=64, kv_type="f32") as oracle:
        want = oracle.logits(TOKENS)
    assert float(np.abs(got - want).max()) <= 2e-3  # the F32 bar of test_llama_parity.py (f32 K/V caches)
