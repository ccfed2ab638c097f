"""The demo model's scripts where they need no PyTorch: corpus parsing, export to GGUF, reuse distances."""

from __future__ import annotations

import importlib
import random
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from runner.engine.engine import Engine, EngineConfig
from runner.parity.llama_oracle import LlamaOracle
from runner.synth.presets import PRESETS
from runner.synth.vocab import build_vocab

DUMPAVAIL = """Package: hello
Source: hello (2.10-3)
Version: 2.10-3
Installed-Size: 280
Depends: libc6 (>= 2.34)
Description: example package based on GNU hello
Homepage: https://www.gnu.org/software/hello/
Tag: implemented-in::c, interface::commandline, role::program,
 suite::gnu
Section: devel
Priority: optional

Package: hello
Version: 2.10-3+deb12u1
Installed-Size: 281
Depends: libc6 (>= 2.34), libintl | gettext-base
Description: example package based on GNU hello
Section: devel
Priority: optional

Package: nodesc
Section: misc
"""
STATUS = """Package: hello
Status: install ok installed
Description: example package based on GNU hello
 The GNU hello program produces a familiar, friendly greeting.
 .
 It allows non-programmers to use a classic computer science tool.
"""


def _script(name: str):
    return importlib.import_module(f"scripts.demo.{name}")


@pytest.fixture(scope="module")
def corpus():
    return _script("build_corpus")


def test_packages_take_the_last_stanza_and_the_installed_long_description(corpus) -> None:
    packages = corpus.load_packages(DUMPAVAIL, STATUS)
    assert [p.name for p in packages] == ["hello"]  # a package without a description is no document
    hello = packages[0]
    assert hello.version == "2.10-3+deb12u1" and hello.depends == ("libc6", "libintl")
    assert hello.long == ("The GNU hello program produces a familiar, friendly greeting.\n"
                          "It allows non-programmers to use a classic computer science tool.")


def test_documents_are_chats_answered_from_metadata_and_a_plain_record(corpus) -> None:
    docs = corpus.documents(corpus.load_packages(DUMPAVAIL, STATUS), seed=0)
    chats = [d for d in docs if d["kind"] == "chat"]
    assert len(chats) == corpus.LONG_DESC_CONVERSATIONS and sum(d["kind"] == "text" for d in docs) == 1
    for chat in chats:
        roles = [m["role"] for m in chat["messages"] if m["role"] != "system"]
        assert roles == ["user", "assistant"] * (len(roles) // 2) and roles
        assert all("hello" in m["content"] for m in chat["messages"] if m["role"] == "user")
    assert docs == corpus.documents(corpus.load_packages(DUMPAVAIL, STATUS), seed=0)


def test_held_out_split_is_seeded_and_keeps_well_known_packages(corpus) -> None:
    names = [f"pkg{i}" for i in range(5000)]
    held = {n for n in names if corpus.in_test(n, 0)}
    assert 0.01 < len(held) / len(names) < 0.03
    assert held == {n for n in names if corpus.in_test(n, 0)} != {n for n in names if corpus.in_test(n, 1)}
    assert not any(corpus.in_test(n, s) for n in corpus.WELL_KNOWN for s in range(20))


def test_export_writes_a_q8_0_glm4moe_that_the_runner_and_llama_cpp_agree_on(tmp_path: Path) -> None:
    export = _script("export_demo")
    shape = PRESETS["glm4moe"]["tiny"]
    rng = np.random.default_rng(0)
    weights = {t.name: rng.standard_normal(t.shape, dtype=np.float32) / np.sqrt(t.shape[-1]) * 4
               for t in export.demo_plan(shape)}
    out = tmp_path / "demo.gguf"
    size = export.export(weights, shape, build_vocab("glm4moe", shape.n_vocab, corpus="apt install hello " * 20),
                         out, QT.Q8_0, step=3)
    assert size == out.stat().st_size
    engine = Engine.load(out, EngineConfig(n_ctx=64))
    assert engine.nextn and engine.nextn[0].weights.embed is engine.model.weights.token_embd
    assert engine.model.weights.layers[1].ffn.gate_exps.qtype == QT.Q8_0
    assert len(engine.tokenizer.encode(" hello")) == 1  # merges learned from the given corpus
    tokens = [5, 77, 300, 12, 9, 481, 33, 250]
    with LlamaOracle(out, n_ctx=64) as oracle:
        want = oracle.logits(tokens)
    got = Engine.load(out, EngineConfig(n_ctx=64)).logits_all(tokens)
    assert np.array_equal(got.argmax(-1), want.argmax(-1))


def test_quantize_gguf_requantizes_with_llama_cpp_into_a_file_the_runner_reads(tmp_path: Path) -> None:
    """The shipped demo (Q5_K_S, made by this script) to Q8_0: llama.cpp picks the types, the runner
    loads what it wrote and agrees with llama.cpp on it; a bad request is a one-line error."""
    from runner.cli.support import default_model_path

    quantize = _script("quantize_gguf")
    demo = Engine.load(default_model_path(), EngineConfig(n_ctx=64))
    assert demo.model.weights.layers[1].ffn.gate_exps.qtype == QT.Q5_K
    out = tmp_path / "demo-q8_0.gguf"
    size = quantize.quantize(default_model_path(), out, "Q8_0", threads=2)
    assert size == out.stat().st_size > default_model_path().stat().st_size
    engine = Engine.load(out, EngineConfig(n_ctx=64))
    assert engine.model.weights.layers[1].ffn.gate_exps.qtype == QT.Q8_0
    assert engine.model.weights.layers[1].attn_norm.qtype == QT.F32  # 1-D tensors stay F32
    tokens = engine.tokenizer.encode("What does curl do?")
    with LlamaOracle(out, n_ctx=64) as oracle:
        want = oracle.logits(tokens)
    assert np.array_equal(engine.logits_all(tokens).argmax(-1), want.argmax(-1))
    with pytest.raises(quantize.QuantizeError, match="no such file"):
        quantize.quantize(tmp_path / "missing.gguf", tmp_path / "x.gguf")
    with pytest.raises(quantize.QuantizeError, match="unknown type 'Q3_X'"):
        quantize.quantize(out, tmp_path / "x.gguf", "Q3_X")


def test_an_lru_cache_hits_below_the_reuse_distance_and_misses_at_or_above_it() -> None:
    eval_demo = _script("eval_demo")
    rng = random.Random(0)
    # Sticky routing (like a trained router): often the previous token's experts again.
    steps, previous = [], frozenset({0, 1})
    for _ in range(400):
        previous = previous if rng.random() < 0.5 else frozenset(rng.sample(range(16), 2))
        steps.append(previous)
    distances = eval_demo.reuse_distances(steps)
    assert len(distances) == 2 * len(steps) and distances[:2] == [None, None] and distances[2:4] == [0, 0]
    for slots in (2, 4, 8, 12):
        hits = eval_demo.lru_hits(steps, slots)
        assert len(hits) == len(distances)
        for d, hit in zip(distances, hits):
            if d is None or d >= slots:
                assert not hit
            elif d < slots - 1:  # k = 2: one expert of the same step may have been admitted after it
                assert hit
    assert sum(eval_demo.lru_hits(steps, 16)) == len(steps) * 2 - len({e for s in steps for e in s})


def test_decode_routing_records_each_decode_step_of_every_moe_layer() -> None:
    from runner.package_data import demo_model_path

    report = _script("eval_demo").decode_routing(demo_model_path(), [[1, 2, 3, 4, 5]], 8, [4])
    # 8 generated tokens: the first comes from the prompt's forward, the other 7 from decode steps
    assert report["layers"] and all(v["real"]["tokens"] == 7 for v in report["layers"].values())
