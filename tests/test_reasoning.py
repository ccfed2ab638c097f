"""Thinking (issue 24, item 2): <think>...</think> split into reasoning_content as llama-server's
--reasoning-format deepseek does (whole and streamed), chat_template_kwargs and reasoning_effort reach
the template, and a final assistant message is continued (prefill). Replies are scripted."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from scripted_engine import ScriptedEngine
from test_server_harness import assert_openai_error, live_server, openai_client

from runner.engine.engine import Engine, EngineConfig
from runner.gguf_file import open_gguf
from runner.server import ServerConfig, create_app
from runner.server.reasoning import ReasoningSplitter, split_reasoning

TEMPLATES = Path(__file__).parent / "templates"
GLM = (TEMPLATES / "glm-4.6.jinja").read_text()
THOUGHT_AND_ANSWER = "<think>The user adds 2 and 2.\nThat is 4.</think>\n\nThe answer is 4."


# -- the splitter ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, in_reasoning, want", [
    (THOUGHT_AND_ANSWER, False, ("The user adds 2 and 2.\nThat is 4.", "The answer is 4.")),
    ("\n<think>plan</think>answer", False, ("plan", "answer")),
    ("plan</think>\nanswer", True, ("plan", "answer")),  # the prompt opened <think>
    ("just an answer", False, (None, "just an answer")),
    ("<thinking> is not the tag", False, (None, "<thinking> is not the tag")),
    ("<think>cut off by max_tokens", False, ("cut off by max_tokens", "")),
    ("<think></think>answer", False, (None, "answer")),
    ("an answer that mentions </think>", False, (None, "an answer that mentions </think>")),
])
def test_split_reasoning(text: str, in_reasoning: bool, want: tuple) -> None:
    assert split_reasoning(text, in_reasoning) == want


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_streamed_pieces_add_up_to_the_whole_split_and_never_show_a_tag(size: int) -> None:
    splitter = ReasoningSplitter()
    pieces = [p for i in range(0, len(THOUGHT_AND_ANSWER), size)
              for p in splitter.push(THOUGHT_AND_ANSWER[i:i + size])] + splitter.flush()
    reasoning = "".join(t for kind, t in pieces if kind == "reasoning_content")
    content = "".join(t for kind, t in pieces if kind == "content")
    assert (reasoning, content) == split_reasoning(THOUGHT_AND_ANSWER)
    assert not any("<" in t and "think" in t for _, t in pieces)


# -- through the server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_path(synth_model):
    return synth_model("glm4moe")


def scripted(model_path: Path, template: str) -> ScriptedEngine:
    return ScriptedEngine(Engine(open_gguf(model_path), EngineConfig(n_ctx=1024), chat_template=template))


@pytest.fixture(scope="module")
def glm(model_path):
    engine = scripted(model_path, GLM)
    with live_server(create_app(engine, ServerConfig(model_id="glm"))) as url:
        yield url, engine


def rendered(engine: ScriptedEngine) -> str:
    """The last prompt as text, special tokens included."""
    tok = engine.tokenizer
    return b"".join(tok.token_bytes(t) or tok.token_text(t).encode() for t in engine.prompts[-1]).decode()


ASK = [{"role": "user", "content": "What is 2 + 2?"}]


def test_reasoning_content_is_split_from_content(glm) -> None:
    url, engine = glm
    engine.script(THOUGHT_AND_ANSWER)
    got = openai_client(url).chat.completions.create(model="glm", messages=ASK)
    message = got.choices[0].message
    assert message.content == "The answer is 4." and got.choices[0].finish_reason == "stop"
    assert message.model_extra["reasoning_content"] == "The user adds 2 and 2.\nThat is 4."


def test_streamed_reasoning_deltas_then_content_deltas(glm) -> None:
    url, engine = glm
    engine.script(THOUGHT_AND_ANSWER)
    chunks = list(openai_client(url).chat.completions.create(
        model="glm", messages=ASK, stream=True, stream_options={"include_usage": True},
        extra_body={"return_token_ids": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    kinds = [k for d in deltas for k in ("reasoning_content", "content") if (d.model_extra or {}).get(k) or
             (k == "content" and d.content)]
    assert kinds == sorted(kinds, key=lambda k: k == "content")  # all reasoning first, then the answer
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == \
        "The user adds 2 and 2.\nThat is 4."
    assert "".join(d.content or "" for d in deltas) == "The answer is 4."
    token_ids = [t for c in chunks if c.choices for t in c.choices[0].model_extra.get("token_ids") or []]
    assert len(token_ids) == chunks[-1].usage.completion_tokens  # each token reported once


def test_reasoning_format_none_leaves_the_tags_in_content(glm) -> None:
    url, engine = glm
    engine.script(THOUGHT_AND_ANSWER)
    got = openai_client(url).chat.completions.create(model="glm", messages=ASK, extra_body={"reasoning_format": "none"})
    assert got.choices[0].message.content == THOUGHT_AND_ANSWER
    assert "reasoning_content" not in got.choices[0].message.model_extra


def test_enable_thinking_false_reaches_the_template(glm) -> None:
    url, engine = glm
    engine.script("4")
    got = openai_client(url).chat.completions.create(
        model="glm", messages=ASK, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert got.choices[0].message.content == "4"
    assert rendered(engine).endswith("What is 2 + 2?/nothink<|assistant|>\n<think></think>")
    engine.script("4")
    openai_client(url).chat.completions.create(model="glm", messages=ASK)
    assert rendered(engine).endswith("What is 2 + 2?<|assistant|>")


def test_template_variables_a_request_may_not_set_are_refused(glm) -> None:
    url, _ = glm
    for name in ("messages", "add_generation_prompt", "bos_token", "1x"):
        body = {"messages": ASK, "chat_template_kwargs": {name: True}}
        error = assert_openai_error(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30), 400)
        assert error["param"] == "chat_template_kwargs" and name in error["message"]
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}


def test_a_final_assistant_message_is_continued(glm) -> None:
    url, engine = glm
    engine.script(" 4, of course.")
    prefill = [*ASK, {"role": "assistant", "content": "The answer is"}]
    got = openai_client(url).chat.completions.create(model="glm", messages=prefill)
    assert got.choices[0].message.content == " 4, of course."
    assert rendered(engine).endswith("What is 2 + 2?<|assistant|>The answer is")
    two = [*prefill, {"role": "assistant", "content": "again"}]
    error = assert_openai_error(httpx.post(f"{url}/v1/chat/completions", json={"messages": two}, timeout=30), 400)
    assert error["param"] == "messages" and "prefill" in error["message"]


def test_reasoning_content_in_the_history_reaches_the_template(glm) -> None:
    url, engine = glm
    engine.script("ok")
    history = [*ASK, {"role": "assistant", "content": "4", "reasoning_content": "2 and 2 make 4"},
               {"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "Yes",
                                                      "reasoning_content": "checking again"}]
    openai_client(url).chat.completions.create(model="glm", messages=[*history, {"role": "user", "content": "Ok"}])
    text = rendered(engine)
    # GLM shows the thinking of turns after the last user message only; older turns get an empty block.
    assert "<|assistant|>\n<think></think>\n4" in text and "checking again" not in text


def test_a_prompt_that_opens_thinking_starts_the_reply_inside_it(model_path) -> None:
    r1_style = "{% for m in messages %}<|user|>{{ m.content }}{% endfor %}<|assistant|><think>\n"
    engine = scripted(model_path, r1_style)
    engine.script("Two and two.</think>\n4")
    with live_server(create_app(engine, ServerConfig(model_id="r1"))) as url:
        message = openai_client(url).chat.completions.create(model="r1", messages=ASK).choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == ("Two and two.", "4")


def test_no_split_when_the_template_never_thinks(model_path) -> None:
    engine = ScriptedEngine(Engine.load(model_path, EngineConfig(n_ctx=1024)))  # the synthetic GLM template
    engine.script(THOUGHT_AND_ANSWER)
    with live_server(create_app(engine, ServerConfig(model_id="plain"))) as url:
        message = openai_client(url).chat.completions.create(model="plain", messages=ASK).choices[0].message
    assert message.content == THOUGHT_AND_ANSWER


def test_reasoning_effort_is_a_template_variable(model_path) -> None:
    engine = scripted(model_path, "{% for m in messages %}{{ m.content }}{% endfor %}effort={{ reasoning_effort }}")
    engine.script("ok")
    with live_server(create_app(engine, ServerConfig(model_id="m"))) as url:
        openai_client(url).chat.completions.create(model="m", messages=ASK, reasoning_effort="high")
        assert rendered(engine).endswith("effort=high")
        bad = httpx.post(f"{url}/v1/chat/completions", json={"messages": ASK, "reasoning_effort": "max"}, timeout=30)
        assert assert_openai_error(bad, 400)["param"] == "reasoning_effort"
