"""tool_choice "required" and a named function (issue 24 item 1, by item 3's constrained decoding): the reply
is held to the tool-call syntax of the model's own template, so even random weights call a tool, with
arguments valid under its schema, parsed into tool_calls (GLM-4.6's, Qwen3's and Qwen3-Coder's real
templates on synthesized models; whole, streamed, and with MTP)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest
from test_server_harness import assert_openai_error, live_server, openai_client

from runner.engine.engine import Engine, EngineConfig
from runner.gguf_file import open_gguf
from runner.server import ServerConfig, create_app
from runner.server.tool_grammar import tool_call_grammar
from runner.spec.config import DraftConfig

TEMPLATES = Path(__file__).parent / "templates"
# Parameters whose values end on their own (random weights may never close a free string).
WEATHER_PARAMS = {"type": "object", "properties": {
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "alerts": {"type": "boolean"}}, "required": ["unit", "days", "alerts"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME["function"]["parameters"]}
ASK = [{"role": "user", "content": "Weather in Zürich for 3 days?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module", params=[("glm4moe", "glm-4.6.jinja"), ("qwen3moe", "qwen3.jinja"),
                                        ("qwen3moe", "qwen3-coder.jinja")], ids=["glm", "qwen3", "qwen3_xml"])
def server(request, synth_model):
    arch, template = request.param
    engine = Engine(open_gguf(synth_model(arch)), EngineConfig(n_ctx=4096),
                    chat_template=(TEMPLATES / template).read_text())
    with live_server(create_app(engine, ServerConfig(model_id="m"))) as url:
        yield url


def _assert_valid(calls, names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("seed", [1, 2])
def test_required_calls_one_of_the_tools(server, seed) -> None:
    got = openai_client(server).chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False,
        max_tokens=400, temperature=1.0, seed=seed, extra_body=NO_THINKING)
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert len(choice.message.tool_calls) == 1
    _assert_valid(choice.message.tool_calls, {"get_weather", "get_time"})


def test_a_named_function_is_the_one_called_streamed(server) -> None:
    chunks = list(openai_client(server).chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=400, temperature=0.8, seed=3, stream=True, extra_body=NO_THINKING))
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [c.function.name for c in calls] == ["get_time"]
    _assert_valid(calls, {"get_time"})
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_forced_call_needs_tools_that_it_names(server) -> None:
    def post(**body) -> dict:
        r = httpx.post(f"{server}/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **body}, timeout=30)
        return assert_openai_error(r, 400)

    assert post(tool_choice="required")["param"] == "tool_choice"
    named = post(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert named["param"] == "tool_choice.function.name" and "'get_time'" in named["message"]
    both = post(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"})
    assert "both constrain" in both["message"]


def test_greedy_mtp_forced_call_equals_plain(synth_model) -> None:
    path = synth_model("glm4moe")
    template = (TEMPLATES / "glm-4.6.jinja").read_text()
    bodies = []
    for draft in (None, DraftConfig("mtp")):
        engine = Engine(open_gguf(path), EngineConfig(n_ctx=4096), chat_template=template)
        with live_server(create_app(engine, ServerConfig(model_id="m", draft=draft))) as url:
            got = openai_client(url).chat.completions.create(
                model="m", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=400, temperature=0,
                extra_body={**NO_THINKING, "return_token_ids": True})
        bodies.append(got.choices[0])
    plain, drafted = bodies
    assert drafted.model_extra["token_ids"] == plain.model_extra["token_ids"]
    _assert_valid(drafted.message.tool_calls, {"get_weather"})


def test_the_grammar_writes_each_syntax_as_its_template_does() -> None:
    glm = tool_call_grammar("glm", [WEATHER], parallel=False)
    assert '"<tool_call>get_weather\\n" "<arg_key>unit</arg_key>\\n<arg_value>" ("celsius" | "fahrenheit")' in glm
    assert glm.startswith("start: call\n")
    qwen = tool_call_grammar("qwen3", [WEATHER, TIME], parallel=True)
    assert qwen.startswith('start: call ("\\n" call)*') and "call: call_0 | call_1" in qwen
    xml = tool_call_grammar("qwen3_xml", [TIME], parallel=False)
    assert '"<tool_call>\\n<function=get_time>\\n" "<parameter=zone>\\n" ("UTC" | "CET")' in xml
