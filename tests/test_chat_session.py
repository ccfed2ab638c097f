"""ChatSession without a terminal: prompts that reuse the KV prefix, interruption, context limits, files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runner.cli.chat import summary
from runner.cli.chat_session import ChatSession, ChatSettings, Message, TurnStats
from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.engine.tokenizer import Tokenizer
from runner.errors import ChatError, TokenizerError

GREEDY = ChatSettings(temperature=0, max_tokens=40)


@pytest.fixture
def glm_engine(synth_model) -> Engine:
    return Engine.load(synth_model("glm4moe"), EngineConfig(n_ctx=512))


def test_reply_is_the_engines_greedy_continuation_of_the_rendered_template(glm_engine, synth_model) -> None:
    session = ChatSession(glm_engine, GREEDY, system="Be brief.")
    pieces: list[str] = []
    stats = session.chat("Hello", on_text=pieces.append)

    fresh = Engine.load(synth_model("glm4moe"), EngineConfig(n_ctx=512))
    text = fresh.tokenizer.render_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}])
    prompt = fresh.tokenizer.encode(text, add_special=True, parse_special=True)
    expected = fresh.generate(prompt, 40, SamplingParams(temperature=0)).run()
    reply = session.messages[-1]
    assert list(reply.tokens) == expected.tokens and reply.content == expected.text == "".join(pieces)
    assert (stats.prompt_tokens, stats.cached_tokens, stats.finish_reason) == (len(prompt), 0, expected.finish_reason)
    assert [m.role for m in session.messages] == ["user", "assistant"] and not reply.interrupted


def test_next_turn_prefills_only_its_own_tokens(glm_engine) -> None:
    session = ChatSession(glm_engine, GREEDY)
    first = session.chat("Hello")
    reply = session.messages[-1]
    # The sampled ids, not a re-tokenization of the reply text, follow the first prompt.
    assert session.prompt_tokens(session.messages + [Message("user", "Again")])[: first.prompt_tokens + len(reply.tokens)] \
        == glm_engine.kv_tokens[: first.prompt_tokens] + list(reply.tokens)
    second = session.chat("Again")

    tok = glm_engine.tokenizer
    history = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "x"}]
    before = tok.render_chat(history, add_generation_prompt=False)
    after = tok.render_chat(history + [{"role": "user", "content": "Again"}])
    new_turn = tok.encode(after[len(before):], add_special=False)
    # A reply cut by max_tokens never fed its last token through the model: the next turn prefills it.
    unfed = 1 if first.finish_reason == "length" else 0
    assert second.new_tokens == len(new_turn) + unfed
    assert second.cached_tokens == first.prompt_tokens + first.completion_tokens - unfed
    assert session.totals.turns == 2 and session.totals.cached_tokens == second.cached_tokens


def test_stopped_reply_is_kept_as_interrupted_and_the_session_goes_on(glm_engine) -> None:
    session = ChatSession(glm_engine, ChatSettings(temperature=0, max_tokens=200))
    pieces: list[str] = []
    stats = session.chat("Hello", on_text=pieces.append, should_stop=lambda: len(pieces) >= 3)
    assert stats.finish_reason == "interrupted" and 3 <= stats.completion_tokens < 200
    assert session.messages[-1].interrupted and len(session.messages[-1].tokens) == stats.completion_tokens
    held = len(glm_engine.kv_tokens)  # the last token too when a greedy chain's step ahead had fed it
    assert held == stats.prompt_tokens + stats.completion_tokens - (0 if Engine.GREEDY_AHEAD else 1)
    again = session.chat("Go on")
    assert again.finish_reason in ("stop", "length")
    assert again.cached_tokens == held
    assert session.totals.turns == 2 and session.totals.interrupted == 1


def test_full_context_is_a_chat_error_and_leaves_the_conversation(synth_model) -> None:
    engine = Engine.load(synth_model("glm4moe"), EngineConfig(n_ctx=40))
    session = ChatSession(engine, ChatSettings(temperature=0, max_tokens=50))
    first = session.chat("Hello")
    assert first.context_full and first.finish_reason == "length" and first.prompt_tokens + first.completion_tokens == 40
    with pytest.raises(ChatError, match="context full.*/reset"):
        session.chat("Tell me more")
    assert len(session.messages) == 2
    session.reset()
    assert session.chat("Hi").completion_tokens > 0


def test_save_and_load_keep_the_exact_reply_ids(glm_engine, tmp_path: Path) -> None:
    session = ChatSession(glm_engine, ChatSettings(temperature=0.5, seed=7, max_tokens=20), system="S")
    session.chat("Hello")
    session.chat("More")
    path = tmp_path / "c.json"
    session.save(path)
    data = json.loads(path.read_text())
    assert data["system"] == "S" and data["settings"]["seed"] == 7 and data["settings"]["max_tokens"] == 20
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "user", "assistant"]

    other = ChatSession(glm_engine, GREEDY)
    other.load(path)
    assert other.system == "S" and other.messages == session.messages and other.settings == session.settings
    probe = [Message("user", "next")]
    assert other.prompt_tokens(other.messages + probe) == session.prompt_tokens(session.messages + probe)

    data["messages"][1]["content"] = "edited"  # ids that no longer spell the text are dropped
    path.write_text(json.dumps(data))
    other.load(path)
    assert other.messages[1] == Message("assistant", "edited")


@pytest.mark.parametrize("content, message", [
    ("not json", "not a JSON chat file"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', "message 0 needs a role"),
    ('{"messages": [], "settings": {"temperature": -1}}', "bad settings"),
])
def test_bad_chat_files_are_one_line_errors(glm_engine, tmp_path: Path, content: str, message: str) -> None:
    session = ChatSession(glm_engine, GREEDY)
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ChatError, match=message) as info:
        session.load(path)
    assert "\n" not in str(info.value)
    with pytest.raises(ChatError, match="cannot read"):
        session.load(tmp_path / "missing.json")


def test_template_that_rewrites_replies_falls_back_to_plain_tokenization(glm_engine, synth_model) -> None:
    trimming = glm_engine.tokenizer.chat_template.replace("message['content']", "message['content'] | trim")
    glm_engine.tokenizer = Tokenizer(synth_model("glm4moe"), chat_template=trimming)
    session = ChatSession(glm_engine, GREEDY)
    tok = glm_engine.tokenizer
    spaced = [Message("user", "Hi"), Message("assistant", " yes ", tuple(tok.encode(" yes "))), Message("user", "So")]
    plain = [{"role": m.role, "content": m.content} for m in spaced]
    assert session.prompt_tokens(spaced) == tok.encode(tok.render_chat(plain), add_special=True)
    exact = [Message("user", "Hi"), Message("assistant", "yes", (tok.encode("y")[0], tok.encode("es")[0]))]
    assert session.prompt_tokens(exact)[-4:-2] == list(exact[1].tokens)  # spliced where the template allows


def test_a_template_that_cannot_render_fails_at_start(glm_engine, synth_model) -> None:
    glm_engine.tokenizer = Tokenizer(synth_model("glm4moe"), chat_template="{{ raise_exception('no chat') }}")
    with pytest.raises(TokenizerError, match="no chat"):
        ChatSession(glm_engine, GREEDY)


def test_summary_shows_later_figures_only_when_measured() -> None:
    base = TurnStats(30, 20, 0.1, 100.0, 8, 0.2, 35.0, "stop")
    line = summary(base)
    assert line.startswith("[30 prompt tokens: 10 new, 20 cached") and "finish: stop" in line
    assert "draft" not in line and "PCIe" not in line and "cache hits" not in line
    more = summary(TurnStats(30, 20, 0.1, 100.0, 8, 0.2, 35.0, "stop", draft_acceptance=0.75,
                             cache_hit_rate=0.9, pcie_bytes=3 * 2**20))
    assert "draft acceptance 75%" in more and "expert cache hits 90%" in more and "PCIe 3.0 MiB" in more


def test_seeded_sessions_repeat_their_replies(glm_engine) -> None:
    settings = ChatSettings(temperature=1.0, seed=3, max_tokens=12)
    a, b = ChatSession(glm_engine, settings), ChatSession(glm_engine, settings)
    a.chat("Hello")
    b.chat("Hello")
    assert a.messages == b.messages
    assert settings.sampling(0).seed != settings.sampling(1).seed


# -- hostile chat files: one ChatError, the session as it was ----------------------------------------------------
def _loaded_session(glm_engine) -> ChatSession:
    session = ChatSession(glm_engine, ChatSettings(temperature=0, seed=5, max_tokens=6), system="S")
    session.chat("Hello")
    return session


def _refused_and_kept(session: ChatSession, path: Path, message: str) -> None:
    before = (session.system, list(session.messages), session.settings)
    with pytest.raises(ChatError, match=message) as info:
        session.load(path)
    assert "\n" not in str(info.value) and len(str(info.value)) < 300, str(info.value)
    assert (session.system, session.messages, session.settings) == before


BAD_SETTINGS = [
    ({"seed": "1"}, "seed must be null or an integer"), ({"seed": 1.5}, "seed must be"), ({"seed": True}, "seed must"),
    ({"seed": -1}, "seed must be"), ({"seed": 2**64}, "seed must be"), ({"max_tokens": 1.5}, "max_tokens must be an int"),
    ({"max_tokens": "10"}, "max_tokens must be an integer"), ({"max_tokens": 0}, "max_tokens must be >= 1"),
    ({"temperature": "hot"}, "temperature must be a number"), ({"temperature": True}, "temperature must be a number"),
    ({"top_k": 1.5}, "top_k must be an integer"), ({"top_p": [1]}, "top_p must be a number, got a list"),
    ({"min_p": {"a": 1}}, "min_p must be a number, got an object"), ({"n_ctx": "4096"}, "n_ctx must be a positive"),
    ({"seed": [[[[[[[[1]]]]]]]]}, "seed must be .*got a list"), ({"turbo": 1}, "unknown field 'turbo'"),
]


@pytest.mark.parametrize("settings, message", BAD_SETTINGS)
def test_wrongly_typed_settings_are_refused_and_the_session_kept(glm_engine, tmp_path: Path, settings: dict,
                                                                 message: str) -> None:
    session = _loaded_session(glm_engine)
    path = tmp_path / "typed.json"
    path.write_text(json.dumps({"messages": [], "settings": settings}))
    _refused_and_kept(session, path, message)
    assert session.chat("Still here?").completion_tokens > 0


BAD_FIELDS = [
    ({"system": 5}, "'system' must be a string, got 5"), ({"format": "runner-chat/9"}, "format 'runner-chat/9' is not"),
    ({"model": ["x"]}, "'model' must be a string, got a list"), ({"settings": [1]}, "'settings' must be an object"),
    ({"messages": {}}, "an object with a 'messages' list"), ({"extra": 1}, "unknown field 'extra'"),
    ({"messages": [{"role": ["user"], "content": "x"}]}, "message 0 needs a role"),
    ({"messages": [{"role": "user", "content": 3}]}, "message 0 needs a role"),
    ({"messages": [{"role": "assistant", "content": "x", "tokens": "abc"}]}, "message 0's tokens must be a list"),
    ({"messages": [{"role": "assistant", "content": "x", "tokens": [1, True]}]}, "tokens must be a list of token ids"),
    ({"messages": [{"role": "assistant", "content": "x", "interrupted": "yes"}]}, "interrupted must be true or false"),
    ({"messages": [{"role": "user", "content": "x", "name": "eve"}]}, "message 0: unknown field 'name'"),
    ({"messages": [{"role": "user", "content": "\udcff"}]}, "message 0's content is not valid UTF-8 \\(byte 0xff"),
    ({"system": "\ud800"}, "'system' is not valid UTF-8 \\(U\\+D800"),
    ({"messages": [{"role": "user", "content": "x"}] * 513}, "513 messages cannot fit a context of 512 tokens"),
    ({"messages": [{"role": "user", "content": "x" * 10_000, "tokens": [[[1]]] * 3}]}, "tokens must be a list"),
]


@pytest.mark.parametrize("fields, message", BAD_FIELDS)
def test_wrongly_typed_fields_are_refused_and_the_session_kept(glm_engine, tmp_path: Path, fields: dict,
                                                               message: str) -> None:
    session = _loaded_session(glm_engine)
    path = tmp_path / "typed.json"
    path.write_text(json.dumps({"messages": [], **fields}))
    _refused_and_kept(session, path, message)


@pytest.mark.parametrize("depth", [50, 900, 200_000])
def test_nesting_deeper_than_a_chat_file_is_refused(glm_engine, tmp_path: Path, depth: int) -> None:
    """Past the parser's recursion limit it is refused as nesting; below it, as a field of the wrong type."""
    session = _loaded_session(glm_engine)
    path = tmp_path / "deep.json"
    nested = "[" * depth + "]" * depth
    path.write_text(f'{{"messages": [{{"role": "assistant", "content": "x", "tokens": {nested}}}]}}')
    _refused_and_kept(session, path, "nested deeper than JSON parsing goes|tokens must be a list of token ids")
    path.write_text(f'{{"messages": [], "settings": {{"seed": {nested}}}}}')
    _refused_and_kept(session, path, "nested deeper than JSON parsing goes|seed must be .*got a list")


def test_files_that_are_not_small_regular_files_are_refused_without_blocking(glm_engine, tmp_path: Path) -> None:
    session = _loaded_session(glm_engine)
    _refused_and_kept(session, Path("/dev/zero"), "/dev/zero: not a regular file .*at most 4 MiB")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening one for reading would block until a writer came
    _refused_and_kept(session, fifo, "not a regular file")
    _refused_and_kept(session, tmp_path, "not a regular file|Is a directory")
    big = tmp_path / "big.json"
    big.write_text('{"messages": [], "system": "' + "x" * (4 << 20) + '"}')
    _refused_and_kept(session, big, "larger than the 4 MiB a chat file may have")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00{")
    _refused_and_kept(session, binary, "not a JSON chat file: not UTF-8")
    with pytest.raises(ChatError, match="cannot save to .*not a regular file"):
        session.save(fifo)  # no reader: refused at once instead of waiting for one
    with pytest.raises(ChatError, match="cannot save to .*not a regular file"):
        session.save("/dev/null")
