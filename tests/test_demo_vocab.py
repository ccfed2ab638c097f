"""A vocabulary learned from a given corpus (the trained demo model's), loaded by llama.cpp's tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.engine.tokenizer import Tokenizer
from runner.synth.vocab import build_vocab, to_mapped, write_vocab_only

# Package-metadata prose: "dpkg" and "package" are frequent here and rare in the embedded corpus.
CORPUS = "\n".join(
    f"dpkg-tool-{i}: a package manager helper for Debian packages, version {i}.{i % 7}. "
    f"The package dpkg-tool-{i} depends on dpkg and libc6."
    for i in range(400)
)
TEXTS = [
    "dpkg-tool-17 depends on dpkg.",
    "What does the package coreutils provide?",
    "héllo 日本 🙂 and tabs\tand\nnewlines",
    "Run: sudo apt install vim\nIt takes about 3.9 MB of disk space.",
]


@pytest.fixture(scope="module")
def learned(tmp_path_factory: pytest.TempPathFactory):
    spec = build_vocab("glm4moe", 640, corpus=CORPUS)
    path = write_vocab_only(tmp_path_factory.mktemp("vocab") / "vocab.gguf", "glm4moe", spec)
    with Tokenizer(path) as tok:
        yield spec, tok


def test_vocab_from_a_corpus_has_exactly_the_requested_size_and_is_deterministic() -> None:
    spec = build_vocab("glm4moe", 640, corpus=CORPUS)
    assert len(spec.tokens) == len(spec.token_types) == 640
    assert spec == build_vocab("glm4moe", 640, corpus=CORPUS)
    assert spec.merges != build_vocab("glm4moe", 640).merges  # learned from this corpus, not the embedded one


def test_frequent_words_of_the_corpus_become_single_tokens(learned) -> None:
    spec, tok = learned
    for word in (" package", " depends", "dpkg"):
        assert to_mapped(word) in spec.tokens
        assert len(tok.encode(word)) == 1, word


def test_learned_vocab_round_trips_text_through_llama_cpp(learned) -> None:
    _, tok = learned
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text
    # Merges learned from this prose make it shorter than its bytes by a wide margin.
    assert len(tok.encode(CORPUS[:2000])) < 2000 / 2.5


def test_chat_template_and_special_tokens_survive_the_learned_vocab(learned) -> None:
    spec, tok = learned
    text = tok.render_chat([{"role": "user", "content": "What is dpkg?"}]) + "dpkg is a package manager.<|user|>"
    ids = tok.encode(text, parse_special=True)
    assert ids[:3] == [spec.special_ids["[gMASK]"], spec.special_ids["<sop>"], spec.special_ids["<|user|>"]]
    assert ids[-1] == spec.eot_id and tok.is_eog(ids[-1])
    assert spec.special_ids["<|assistant|>"] in ids


def test_a_tiny_corpus_is_padded_to_size(tmp_path: Path) -> None:
    spec = build_vocab("glm4moe", 400, corpus="ab ab ab")
    assert len(spec.tokens) == 400 and to_mapped(" ab") in spec.tokens
    with Tokenizer(write_vocab_only(tmp_path / "v.gguf", "glm4moe", spec)) as tok:
        assert tok.n_vocab == 400
        assert tok.decode(tok.encode("ab abc")) == "ab abc"
