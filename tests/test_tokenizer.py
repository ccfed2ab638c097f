"""The synthetic BPE vocabulary and the llama.cpp-backed Tokenizer, on vocab-only GGUF files."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import gguf
import pytest

from runner.engine.tokenizer import Tokenizer
from runner.errors import TokenizerError
from runner.synth.vocab import BYTE_TO_UNICODE, VocabSpec, build_vocab, write_vocab_only

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS = (REPO_ROOT / "runner" / "synth" / "corpus.txt").read_text(encoding="utf-8")

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is a meander?"},
    {"role": "assistant", "content": "A loop in a river."},
    {"role": "user", "content": "Und auf Deutsch? 日本語でも 🙂"},
]

TEXTS = [
    "",
    "hello",
    "The lighthouse keeper's logbook, 1871: fog until noon.",
    "héllo 日本 🙂",
    "  leading and trailing spaces  ",
    "line one\nline two\r\n\n\ttabbed\t\tline\n",
    "naïve café — “quotes” and ‘more’ … ½ ∑ Ω",
    "emoji: 👩‍👩‍👧 🇳🇴 ✨ and combining e\u0301",
    "digits 0123456789 and 3.14159, mixed a1b2c3",
    "code: def f(x):\n    return x ** 2  # ok\n",
    "<|not special|> <|im_end (almost) [gMASK",
]


@pytest.fixture(scope="module")
def make_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Tokenizer, VocabSpec]]:
    made: dict[tuple[str, int], tuple[Tokenizer, VocabSpec]] = {}

    def make(arch: str, size: int = 1024) -> tuple[Tokenizer, VocabSpec]:
        if (arch, size) not in made:
            spec = build_vocab(arch, size)
            path = write_vocab_only(tmp_path_factory.mktemp("vocab") / f"{arch}-{size}.gguf", arch, spec)
            made[arch, size] = (Tokenizer(path, None), spec)
        return made[arch, size]

    yield make
    for tokenizer, _ in made.values():
        tokenizer.close()


def random_texts(seed: int, count: int) -> list[str]:
    """Strings mixing ASCII, whitespace, accented Latin, CJK, emoji and other planes."""
    rng = random.Random(seed)
    ranges = [(0x20, 0x7E), (0x09, 0x0A), (0x0D, 0x0D), (0xA0, 0x17F), (0x370, 0x3FF),
              (0x4E00, 0x4FFF), (0x3040, 0x30FF), (0x1F300, 0x1F64F), (0x10000, 0x1007F)]
    texts = []
    for _ in range(count):
        chars = []
        for _ in range(rng.randint(1, 60)):
            lo, hi = rng.choice(ranges)
            chars.append(chr(rng.randint(lo, hi)))
        texts.append("".join(chars))
    return texts


ARCHS = ["glm4moe", "qwen3moe"]


# -- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_loads_the_synthetic_vocab(make_tokenizer, arch: str) -> None:
    tok, spec = make_tokenizer(arch)
    assert tok.n_vocab == len(spec.tokens) == 1024
    assert tok.eos_id == spec.eos_id
    assert tok.bos_id == spec.bos_id
    assert tok.add_bos is False
    expected_eog = {spec.eos_id, spec.eot_id, spec.eom_id, spec.special_ids["<|endoftext|>"]} - {None}
    assert tok.eog_ids == expected_eog
    assert all(tok.is_eog(t) for t in expected_eog)
    assert not tok.is_eog(tok.encode("a")[0])


def test_load_is_silent(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_vocab_only(tmp_path / "q.gguf", "qwen3moe", build_vocab("qwen3moe", 300))
    capfd.readouterr()
    Tokenizer(path, None).close()
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_unloadable_file_is_one_line_error(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    capfd.readouterr()
    with pytest.raises(TokenizerError) as info:
        Tokenizer(bogus, None)
    assert "\n" not in str(info.value) and "bogus.gguf" in str(info.value)
    assert capfd.readouterr() == ("", "")
    with pytest.raises(TokenizerError):
        Tokenizer(tmp_path / "missing.gguf", None)


# -- encode / decode -------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_round_trip(make_tokenizer, arch: str) -> None:
    tok, _ = make_tokenizer(arch)
    for text in TEXTS + random_texts(seed=7, count=200):
        ids = tok.encode(text, parse_special=False)
        assert all(0 <= t < tok.n_vocab for t in ids)
        assert tok.decode(ids) == text, repr(text)


@pytest.mark.parametrize("arch", ARCHS)
def test_special_tokens_parse_only_when_asked(make_tokenizer, arch: str) -> None:
    tok, spec = make_tokenizer(arch)
    for text, token in spec.special_ids.items():
        assert tok.encode(text, parse_special=True) == [token]
        plain = tok.encode(text, parse_special=False)
        assert len(plain) > 1 and token not in plain
        assert tok.decode(plain) == text
        assert tok.decode([token]) == ""  # control tokens are not rendered
        assert tok.token_bytes(token) == b""
    eos = tok.token_text(spec.eos_id)
    assert tok.encode(f"a{eos}b") == [*tok.encode("a"), spec.eos_id, *tok.encode("b")]


@pytest.mark.parametrize("arch", ARCHS)
def test_add_special_follows_the_vocab(make_tokenizer, arch: str) -> None:
    tok, _ = make_tokenizer(arch)
    assert tok.encode("hi", add_special=True) == tok.encode("hi")  # add_bos is off for both


def test_out_of_range_ids(make_tokenizer) -> None:
    tok, _ = make_tokenizer("glm4moe")
    for bad in (-1, tok.n_vocab, 10**9):
        for call in (tok.token_bytes, tok.is_eog, lambda t: tok.decode([1, t]), tok.token_text):
            with pytest.raises(TokenizerError) as info:
                call(bad)
            assert "\n" not in str(info.value)
        with pytest.raises(TokenizerError):
            tok.decoder().push(bad)


# -- incremental decoding --------------------------------------------------------------------


def stream(tok: Tokenizer, ids: list[int]) -> list[str]:
    decoder = tok.decoder()
    pieces = [decoder.push(t) for t in ids]
    pieces.append(decoder.flush())
    return pieces


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decoder_matches_decode(make_tokenizer, arch: str) -> None:
    tok, _ = make_tokenizer(arch)
    for text in TEXTS + random_texts(seed=11, count=100):
        ids = tok.encode(text)
        pieces = stream(tok, ids)
        assert "".join(pieces) == tok.decode(ids) == text
        assert not any("\ufffd" in piece for piece in pieces)


def test_incremental_decoder_holds_partial_characters(make_tokenizer) -> None:
    tok, _ = make_tokenizer("qwen3moe")
    ids = tok.encode("héllo 日本 🙂")
    # The corpus is ASCII, so multi-byte characters stay split across byte tokens.
    assert any(_is_partial_utf8(tok.token_bytes(t)) for t in ids)
    emoji = [_byte_token(tok, b) for b in "🙂".encode()]
    assert stream(tok, emoji) == ["", "", "", "🙂", ""]
    # A dangling lead byte surfaces only at flush, as one replacement character.
    assert stream(tok, [_byte_token(tok, 0xE6)]) == ["", "\ufffd"]
    assert tok.decode([_byte_token(tok, 0xE6)]) == "\ufffd"


def _byte_token(tok: Tokenizer, byte: int) -> int:
    # Byte tokens are ids 0..255 in the synthetic vocab; check rather than assume.
    assert tok.token_bytes(byte) == bytes([byte])
    return byte


def _is_partial_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


# -- chat templates --------------------------------------------------------------------------


def test_glm_chat_template(make_tokenizer) -> None:
    tok, spec = make_tokenizer("glm4moe")
    rendered = tok.render_chat(CONVERSATION)
    assert rendered == (
        "[gMASK]<sop><|system|>\nYou are terse.<|user|>\nWhat is a meander?"
        "<|assistant|>\nA loop in a river.<|user|>\nUnd auf Deutsch? 日本語でも 🙂<|assistant|>\n"
    )
    ids = tok.encode(rendered)
    s = spec.special_ids
    assert ids[:3] == [s["[gMASK]"], s["<sop>"], s["<|system|>"]]
    assert ids.count(s["<|user|>"]) == 2 and ids.count(s["<|assistant|>"]) == 2
    assert ids[-2:] == [s["<|assistant|>"], *tok.encode("\n")]
    assert tok.decode(ids) == rendered.replace("[gMASK]<sop>", "").replace("<|system|>", "") \
        .replace("<|user|>", "").replace("<|assistant|>", "")
    assert not tok.render_chat(CONVERSATION, add_generation_prompt=False).endswith("<|assistant|>\n")


def test_chatml_template(make_tokenizer) -> None:
    tok, spec = make_tokenizer("qwen3moe")
    rendered = tok.render_chat(CONVERSATION)
    assert rendered.startswith("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n")
    assert rendered.endswith("<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(rendered)
    s = spec.special_ids
    assert ids.count(s["<|im_start|>"]) == 5 and ids.count(s["<|im_end|>"]) == 4
    assert ids[0] == s["<|im_start|>"]
    assert tok.render_chat(CONVERSATION, add_generation_prompt=False).endswith("🙂<|im_end|>\n")


def test_missing_chat_template(tmp_path: Path) -> None:
    spec = dataclasses.replace(build_vocab("glm4moe", 300), chat_template="")
    path = write_vocab_only(tmp_path / "base.gguf", "glm4moe", spec)
    with Tokenizer(path, None) as tok:
        assert tok.chat_template is None
        with pytest.raises(TokenizerError, match=r"base\.gguf: the model has no tokenizer\.chat_template"):
            tok.render_chat(CONVERSATION)
    with Tokenizer(path, "{{ bos_token }}[{{ eos_token }}]{{ messages[0]['content'] }}") as tok:
        assert tok.render_chat(CONVERSATION) == "[<|endoftext|>]You are terse."


def test_template_errors_are_one_line(tmp_path: Path) -> None:
    path = write_vocab_only(tmp_path / "q.gguf", "qwen3moe", build_vocab("qwen3moe", 300))
    with Tokenizer(path, None) as tok:
        with pytest.raises(TokenizerError, match="unsupported role: robot"):
            tok.render_chat([{"role": "robot", "content": "beep"}])
    for template in ("{% for %}", "{{ messages[0]['content'] + 1 }}", "{{ ().__class__.__mro__ }}\n{{ x.y.z }}"):
        with Tokenizer(path, template) as tok:
            with pytest.raises(TokenizerError) as info:
                tok.render_chat(CONVERSATION)
            assert "\n" not in str(info.value)


# -- the synthetic vocabulary ----------------------------------------------------------------


@pytest.mark.parametrize(("arch", "size"), [
    ("glm4moe", 263), ("glm4moe", 512), ("glm4moe", 2048), ("glm4moe", 8192), ("glm4moe", 151552),
    ("qwen3moe", 259), ("qwen3moe", 1000), ("qwen3moe", 151936),
])
def test_build_vocab_sizes(arch: str, size: int) -> None:
    spec = build_vocab(arch, size)
    assert len(spec.tokens) == len(spec.token_types) == size
    assert len(set(spec.tokens)) == size
    n_special = len(spec.special_ids)
    assert spec.token_types[:-n_special] == [gguf.TokenType.NORMAL] * (size - n_special)
    assert spec.token_types[-n_special:] == [gguf.TokenType.CONTROL] * n_special
    assert spec.tokens[:256] == [BYTE_TO_UNICODE[b] for b in range(256)]
    known = set(spec.tokens)
    for merge in spec.merges:
        left, right = merge.split(" ")
        assert {left, right, left + right} <= known
    assert spec == build_vocab(arch, size)


def test_build_vocab_rejects_bad_requests() -> None:
    with pytest.raises(ValueError, match="too small"):
        build_vocab("glm4moe", 262)
    with pytest.raises(ValueError, match="too small"):
        build_vocab("qwen3moe", 100)
    with pytest.raises(ValueError):
        build_vocab("llama", 1000)


def test_build_vocab_is_deterministic_across_processes() -> None:
    # String hashing is randomized per process; nothing in training may depend on it.
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]);"
        "from runner.synth.vocab import build_vocab; s = build_vocab('glm4moe', 3000);"
        "print(json.dumps([s.tokens, s.merges, s.token_types]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code, str(REPO_ROOT)], env=env, check=True,
                         capture_output=True, text=True, cwd=REPO_ROOT).stdout
    here = build_vocab("glm4moe", 3000)
    assert json.loads(out) == [here.tokens, here.merges, here.token_types]


@pytest.mark.parametrize("arch", ARCHS)
def test_merges_are_learned(make_tokenizer, arch: str) -> None:
    tok, spec = make_tokenizer(arch, 4096)
    assert len(spec.merges) > 1000
    n_bytes = len(CORPUS.encode("utf-8"))
    n_tokens = len(tok.encode(CORPUS))
    assert n_tokens < n_bytes / 3.5, (n_tokens, n_bytes)
    assert tok.decode(tok.encode(CORPUS)) == CORPUS


def test_full_size_vocab_loads(tmp_path: Path) -> None:
    spec = build_vocab("qwen3moe", 151936)
    path = write_vocab_only(tmp_path / "big.gguf", "qwen3moe", spec)
    with Tokenizer(path, None) as tok:
        assert tok.n_vocab == 151936
        assert tok.encode("<|im_end|>") == [spec.eos_id]
        text = "The river wanders; 日本 🙂"
        assert tok.decode(tok.encode(text)) == text
