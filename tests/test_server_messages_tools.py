"""Tools on Anthropic's Messages API (issue 24): tools and tool_result history rendered through the model's own
template exactly as the chat path renders them, the family's tool calls as tool_use blocks (whole, streamed as
input_json_delta, read back by the anthropic SDK), thinking blocks, tool_choice by constrained decoding, and
one-line 400s. Random weights never call a tool, so most replies are scripted in the family's real syntax."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx
import jsonschema
import pytest
from scripted_engine import ScriptedEngine
from test_server_harness import assert_openai_error, live_server, openai_client

from runner.engine.engine import Engine, EngineConfig
from runner.gguf_file import open_gguf
from runner.server import ServerConfig, create_app

TEMPLATES = Path(__file__).parent / "templates"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
          "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "Weather for a city", "input_schema": SCHEMA}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                 "parameters": SCHEMA}}
ZURICH_3 = {"city": "Zürich", "days": 3}
QWEN3_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}\n</tool_call>'
GLM_CALL = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>")
ASK = [{"role": "user", "content": "Weather in Zürich for 3 days?"}]


def scripted_server(path: Path, template: str):
    engine = ScriptedEngine(Engine(open_gguf(path), EngineConfig(n_ctx=2048),
                                   chat_template=(TEMPLATES / template).read_text()))
    return engine, live_server(create_app(engine, ServerConfig(model_id="m")))


@pytest.fixture(scope="module")
def qwen(synth_model):
    engine, server = scripted_server(synth_model("qwen3moe"), "qwen3.jinja")
    with server as url:
        yield url, engine


@pytest.fixture(scope="module")
def glm(synth_model):
    engine, server = scripted_server(synth_model("glm4moe"), "glm-4.6.jinja")
    with server as url:
        yield url, engine


def sdk(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)


def events(url: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{url}/v1/messages", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line]
    out = []
    for name, data in zip(lines[::2], lines[1::2]):
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        out.append(event)
    return out


def test_a_call_is_a_tool_use_block_and_stops_for_tool_use(qwen) -> None:
    url, engine = qwen
    engine.script("I will check.\n" + QWEN3_CALL)
    got = sdk(url).messages.create(model="m", max_tokens=200, messages=ASK, tools=[WEATHER])
    text, call = got.content
    assert text.type == "text" and text.text == "I will check."
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == ZURICH_3
    assert call.id.startswith("toolu_") and got.stop_reason == "tool_use"
    # the tools reach the template as the chat path gives them
    chat_prompt = engine.prompts[-1]
    engine.script("")
    openai_client(url).chat.completions.create(model="m", messages=ASK, tools=[CHAT_WEATHER])
    assert engine.prompts[-1] == chat_prompt


def test_the_stream_sends_a_tool_use_block_as_input_json_delta(qwen) -> None:
    url, engine = qwen
    engine.script("I will check.\n" + QWEN3_CALL)
    got = events(url, {"max_tokens": 200, "messages": ASK, "tools": [WEATHER]})
    kinds = [(e["type"], e.get("index")) for e in got]
    assert kinds[0] == ("message_start", None) and kinds[1] == ("content_block_start", 0)
    assert kinds[-6:] == [("content_block_stop", 0), ("content_block_start", 1), ("content_block_delta", 1),
                          ("content_block_stop", 1), ("message_delta", None), ("message_stop", None)]
    assert "".join(e["delta"]["text"] for e in got if e.get("index") == 0 and "delta" in e) == "I will check."
    start, delta = got[-5], got[-4]
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["input"] == {}
    assert start["content_block"]["name"] == "get_weather" and start["content_block"]["id"].startswith("toolu_")
    assert delta["delta"]["type"] == "input_json_delta" and json.loads(delta["delta"]["partial_json"]) == ZURICH_3
    assert got[-2]["delta"]["stop_reason"] == "tool_use"


def test_the_sdk_stream_accumulates_the_tool_use(qwen) -> None:
    url, engine = qwen
    engine.script(QWEN3_CALL + "\n" + QWEN3_CALL.replace("Zürich", "Bern"))
    with sdk(url).messages.stream(model="m", max_tokens=200, messages=ASK, tools=[WEATHER]) as stream:
        final = stream.get_final_message()
    assert [(b.type, b.input) for b in final.content] == [("tool_use", ZURICH_3), ("tool_use", {**ZURICH_3, "city": "Bern"})]
    assert final.stop_reason == "tool_use" and len({b.id for b in final.content}) == 2


def test_a_tool_result_round_trip_renders_as_the_chat_tool_turn(qwen) -> None:
    url, engine = qwen
    engine.script("It will be 21 degrees.")
    history = [*ASK,
               {"role": "assistant", "content": [{"type": "text", "text": "I will check."},
                                                 {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                  "input": ZURICH_3}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                             "content": [{"type": "text", "text": '{"temp": 21}'}]},
                                            {"type": "text", "text": "And in Fahrenheit?"}]}]
    got = sdk(url).messages.create(model="m", max_tokens=50, messages=history, tools=[WEATHER], system="Be brief.")
    assert got.content[0].text == "It will be 21 degrees." and got.stop_reason == "end_turn"
    messages_prompt = engine.prompts[-1]
    engine.script("")
    chat = [{"role": "system", "content": "Be brief."}, *ASK,
            {"role": "assistant", "content": "I will check.", "tool_calls": [
                {"id": "toolu_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps(ZURICH_3)}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": '{"temp": 21}'},
            {"role": "user", "content": "And in Fahrenheit?"}]
    openai_client(url).chat.completions.create(model="m", messages=chat, tools=[CHAT_WEATHER])
    assert messages_prompt == engine.prompts[-1]
    text = engine.tokenizer.decode(messages_prompt)
    assert '<tool_response>\n{"temp": 21}\n</tool_response>' in text and '"city": "Zürich"' in text


def test_an_error_result_says_so_in_the_tool_turn(qwen) -> None:
    url, engine = qwen
    engine.script("Sorry.")
    history = [*ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                                       "input": ZURICH_3}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "no such city",
                                             "is_error": True}]}]
    sdk(url).messages.create(model="m", max_tokens=20, messages=history, tools=[WEATHER])
    assert "<tool_response>\nError: no such city\n</tool_response>" in engine.tokenizer.decode(engine.prompts[-1])


def test_glm_thinking_is_a_thinking_block_before_the_call(glm) -> None:
    url, engine = glm
    engine.script("<think>The user wants weather.</think>\n" + GLM_CALL)
    got = sdk(url).messages.create(model="m", max_tokens=200, messages=ASK, tools=[WEATHER],
                                   thinking={"type": "enabled", "budget_tokens": 1024})
    thinking, call = got.content
    assert thinking.type == "thinking" and thinking.thinking == "The user wants weather."
    assert call.type == "tool_use" and call.input == ZURICH_3 and got.stop_reason == "tool_use"
    engine.script("<think>Streamed.</think>Sunny.")
    got = events(url, {"max_tokens": 50, "messages": ASK, "tools": [WEATHER]})
    starts = [e["content_block"]["type"] for e in got if e["type"] == "content_block_start"]
    deltas = [(e["index"], e["delta"]) for e in got if e["type"] == "content_block_delta"]
    assert starts == ["thinking", "text"]
    assert "".join(d.get("thinking", "") for i, d in deltas if i == 0) == "Streamed."
    assert "".join(d.get("text", "") for i, d in deltas if i == 1) == "Sunny."


def test_thinking_disabled_is_the_templates_enable_thinking_false(glm) -> None:
    url, engine = glm
    engine.script("Sunny.")
    sdk(url).messages.create(model="m", max_tokens=20, messages=ASK, thinking={"type": "disabled"})
    messages_prompt = engine.prompts[-1]
    engine.script("Sunny.")
    openai_client(url).chat.completions.create(model="m", messages=ASK,
                                               extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert messages_prompt == engine.prompts[-1]


def test_tool_choice_any_and_a_named_tool_force_a_valid_call(synth_model) -> None:
    engine = Engine(open_gguf(synth_model("qwen3moe")), EngineConfig(n_ctx=4096),
                    chat_template=(TEMPLATES / "qwen3.jinja").read_text())
    time_tool = {"name": "get_time", "input_schema": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}
    with live_server(create_app(engine, ServerConfig(model_id="m"))) as url:
        client = sdk(url)
        for choice, names in (({"type": "any", "disable_parallel_tool_use": True}, {"get_time"}),
                              ({"type": "tool", "name": "get_time"}, {"get_time"})):
            got = client.messages.create(model="m", max_tokens=300, messages=ASK, tools=[time_tool],
                                         tool_choice=choice, extra_body={"temperature": 1.0})
            assert got.stop_reason == "tool_use" and [b.type for b in got.content] == ["tool_use"]
            assert got.content[0].name in names
            jsonschema.validate(got.content[0].input, time_tool["input_schema"])


def _tool_use(id_: str = "t1") -> dict:
    return {"type": "tool_use", "id": id_, "name": "get_weather", "input": ZURICH_3}


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": [_tool_use()]}]}, "messages.0.content.0.type"),
    ({"messages": [*ASK, {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}]},
     "messages.1.content.0.type"),
    ({"messages": [*ASK, {"role": "assistant", "content": [_tool_use()]}]}, "messages.1.content"),
    ({"messages": [*ASK, {"role": "assistant", "content": [{**_tool_use(), "input": "{}"}]}]}, "messages.1.content"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "tool", "name": "get_time"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"tools": [WEATHER, {"type": "web_search_20250305", "name": "web_search"}]}, "tools.1"),
    ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
])
def test_bad_tool_requests_are_one_line_400s(qwen, body, param) -> None:
    url, _ = qwen
    request = {"max_tokens": 5, "messages": ASK, "tools": [WEATHER], **body}
    r = httpx.post(f"{url}/v1/messages", json=request, timeout=30)
    error = assert_openai_error(r, 400)  # OpenAI's fields inside Anthropic's shape
    assert r.json()["type"] == "error" and error["type"] == "invalid_request_error"
    assert error["param"].startswith(param) and "\n" not in error["message"]


def test_errors_have_anthropics_shape_and_the_sdk_raises_them(qwen) -> None:
    url, _ = qwen
    with pytest.raises(anthropic.BadRequestError) as raised:
        sdk(url).messages.create(model="m", max_tokens=5, messages=ASK, tool_choice={"type": "any"})
    assert raised.value.body["type"] == "error" and "offers no tools" in raised.value.body["error"]["message"]
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": ASK, "tool_choice": "required"}, timeout=30)
    assert "type" not in r.json() and assert_openai_error(r, 400)["param"] == "tool_choice"  # OpenAI's, elsewhere


def test_refusals_before_the_route_have_anthropics_shape_too() -> None:
    with live_server(create_app(None, ServerConfig(model_id="m", api_key="key"))) as url:
        unauthorized = httpx.post(f"{url}/v1/messages", json={}, timeout=30)
        loading = httpx.post(f"{url}/v1/messages", json={"max_tokens": 5, "messages": ASK},
                             headers={"x-api-key": "key"}, timeout=30)
    assert unauthorized.status_code == 401 and unauthorized.json()["type"] == "error"
    assert unauthorized.json()["error"]["type"] == "authentication_error"
    assert loading.status_code == 503 and loading.json()["error"]["type"] == "overloaded_error"


def test_count_tokens_is_the_prompt_a_message_request_would_run(qwen) -> None:
    url, engine = qwen
    history = [*ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                                       "input": ZURICH_3}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "21 C"}]}]
    counted = sdk(url).messages.count_tokens(model="m", messages=history, tools=[WEATHER], system="Be brief.")
    engine.script("Warm.")
    sdk(url).messages.create(model="m", max_tokens=5, messages=history, tools=[WEATHER], system="Be brief.")
    assert counted.input_tokens == len(engine.prompts[-1])
    bare = sdk(url).messages.count_tokens(model="m", messages=ASK)
    assert 0 < bare.input_tokens < counted.input_tokens  # the tools' schema and the turns count
    r = httpx.post(f"{url}/v1/messages/count_tokens", json={"messages": []}, timeout=30)
    assert_openai_error(r, 400)
    assert r.json()["type"] == "error" and r.json()["error"]["param"] == "messages"  # Anthropic's shape


def test_redacted_thinking_is_dropped_from_the_assistant_turn(qwen) -> None:
    url, engine = qwen
    said = {"type": "text", "text": "I will check."}
    call = {"type": "tool_use", "id": "t1", "name": "get_weather", "input": ZURICH_3}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "21 C"}]}
    prompts = []
    for blocks in ([said, call], [{"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}, said, call]):
        engine.script("Warm.")
        sdk(url).messages.create(model="m", max_tokens=5, tools=[WEATHER],
                                 messages=[*ASK, {"role": "assistant", "content": blocks}, result])
        prompts.append(engine.prompts[-1])
    assert prompts[0] == prompts[1]
    bad = {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "redacted_thinking", "data": "x"}]}]}
    error = assert_openai_error(httpx.post(f"{url}/v1/messages", json=bad, timeout=30), 400)
    assert error["param"] == "messages.0.content.0.type"
