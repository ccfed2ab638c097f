"""Tool calling (issue 24, item 1): tools and tool history rendered with the model's own template, and the
tool calls a GLM-4.5 or Qwen3 model writes parsed into OpenAI tool_calls, whole and streamed. Random
weights never call a tool, so the replies are scripted in each family's real syntax."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from scripted_engine import ScriptedEngine
from test_server_harness import assert_openai_error, live_server, openai_client

from runner.engine.engine import Engine, EngineConfig
from runner.gguf_file import open_gguf
from runner.server import ServerConfig, create_app
from runner.server.tools import ToolCallParser, param_types, parse_tool_calls, template_syntax

TEMPLATES = Path(__file__).parent / "templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city, e.g. Zürich",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TYPES = param_types([WEATHER, TIME])

GLM_CALL = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>")
QWEN3_CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
XML_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n</function>\n</tool_call>")
ZURICH_3 = {"city": "Zürich", "days": 3}


# -- parsing each family's syntax -----------------------------------------------------------------


@pytest.mark.parametrize("template, syntax", [("glm-4.6.jinja", "glm"), ("qwen3.jinja", "qwen3"),
                                              ("qwen3-coder.jinja", "qwen3_xml")])
def test_the_syntax_is_read_from_the_real_template(template: str, syntax: str) -> None:
    assert template_syntax((TEMPLATES / template).read_text()) == syntax
    assert template_syntax("{% for m in messages %}{{ m.content }}{% endfor %}") is None


@pytest.mark.parametrize("syntax, reply", [("glm", "Let me look.\n" + GLM_CALL), ("qwen3_xml", "Let me look.\n" + XML_CALL),
                                           ("qwen3", 'Let me look.\n' + QWEN3_CALLS.split("\n<tool_call>\n{\"name\": \"get_time")[0])])
def test_a_call_is_parsed_with_its_arguments_typed_by_the_schema(syntax: str, reply: str) -> None:
    content, calls = parse_tool_calls(reply, syntax, TYPES)
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", ZURICH_3)]
    assert "Zürich" in calls[0].arguments and calls[0].id.startswith("call_")


def test_a_string_parameter_stays_a_string_and_an_untyped_one_is_read_as_json() -> None:
    reply = "<tool_call>f\n<arg_key>code</arg_key>\n<arg_value>007</arg_value>\n<arg_key>n</arg_key>\n<arg_value>[1, 2]</arg_value></tool_call>"
    _, calls = parse_tool_calls(reply, "glm", {"f": {"code": "string"}})
    assert json.loads(calls[0].arguments) == {"code": "007", "n": [1, 2]}


def test_several_calls_and_parallel_tool_calls_false_keeps_the_first() -> None:
    content, calls = parse_tool_calls(QWEN3_CALLS, "qwen3", TYPES)
    assert content == "" and [c.name for c in calls] == ["get_weather", "get_time"]
    assert [c.name for c in parse_tool_calls(QWEN3_CALLS, "qwen3", TYPES, parallel=False)[1]] == ["get_weather"]


@pytest.mark.parametrize("reply", [
    "<tool_call>\n{not json}\n</tool_call>",  # a broken call stays in the content as written
    "text <tool_call>\n{\"name\": \"get_time\", \"argu",  # cut off by max_tokens inside a call
    "a < b, and <tool is not a tag",
])
def test_what_is_not_a_whole_call_stays_content(reply: str) -> None:
    assert parse_tool_calls(reply, "qwen3", TYPES) == (reply, [])


@pytest.mark.parametrize("syntax, reply", [("glm", "Sure. " + GLM_CALL), ("qwen3", QWEN3_CALLS),
                                           ("qwen3_xml", XML_CALL + "\n")])
def test_streamed_in_any_pieces_gives_the_whole_parse(syntax: str, reply: str) -> None:
    want_content, want_calls = parse_tool_calls(reply, syntax, TYPES)
    for size in (1, 3, 7):
        parser = ToolCallParser(syntax, TYPES)
        events = [e for i in range(0, len(reply), size) for e in parser.push(reply[i:i + size])] + parser.flush()
        assert "".join(v for k, v in events if k == "content") == want_content
        assert [(v.name, v.arguments) for k, v in events if k == "tool_call"] == \
            [(c.name, c.arguments) for c in want_calls]


# -- through the server ---------------------------------------------------------------------------


def scripted(path: Path, template: str) -> ScriptedEngine:
    return ScriptedEngine(Engine(open_gguf(path), EngineConfig(n_ctx=2048),
                                 chat_template=(TEMPLATES / template).read_text()))


@pytest.fixture(scope="module")
def glm(synth_model):
    engine = scripted(synth_model("glm4moe"), "glm-4.6.jinja")
    with live_server(create_app(engine, ServerConfig(model_id="glm"))) as url:
        yield url, engine


@pytest.fixture(scope="module")
def qwen(synth_model):
    engine = scripted(synth_model("qwen3moe"), "qwen3.jinja")
    with live_server(create_app(engine, ServerConfig(model_id="qwen"))) as url:
        yield url, engine


def rendered(engine: ScriptedEngine) -> str:
    tok = engine.tokenizer
    return b"".join(tok.token_bytes(t) or tok.token_text(t).encode() for t in engine.prompts[-1]).decode()


ASK = [{"role": "user", "content": "Weather in Zürich for 3 days?"}]


def test_glm_renders_the_tools_and_its_call_becomes_tool_calls(glm) -> None:
    url, engine = glm
    engine.script("<think>The user wants weather.</think>\n" + GLM_CALL)
    got = openai_client(url).chat.completions.create(model="glm", messages=ASK, tools=[WEATHER])
    # tojson(ensure_ascii=False) in GLM's template: the tool goes in as JSON with its non-ASCII text
    assert '"description": "Weather for a city, e.g. Zürich"' in rendered(engine)
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == "The user wants weather."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == ZURICH_3


def test_tool_history_is_rendered_with_arguments_as_objects(glm) -> None:
    url, engine = glm
    engine.script("It will be 21 degrees.")
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(ZURICH_3)}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}]
    got = openai_client(url).chat.completions.create(model="glm", messages=history, tools=[WEATHER])
    assert got.choices[0].message.content == "It will be 21 degrees." and got.choices[0].finish_reason == "stop"
    text = rendered(engine)
    assert "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n<arg_key>days</arg_key>" \
           "\n<arg_value>3</arg_value>\n</tool_call>" in text
    assert text.endswith('<|observation|>\n<tool_response>\n{"temp": 21}\n</tool_response><|assistant|>')


def test_qwen3_calls_stream_as_tool_call_deltas(qwen) -> None:
    url, engine = qwen
    engine.script("I will check both.\n" + QWEN3_CALLS)
    chunks = list(openai_client(url).chat.completions.create(
        model="qwen", messages=ASK, tools=[WEATHER, TIME], stream=True, stream_options={"include_usage": True},
        extra_body={"return_token_ids": True, "chat_template_kwargs": {"enable_thinking": False}}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "I will check both."
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert [(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == \
        [(0, "get_weather", ZURICH_3), (1, "get_time", {})]
    assert all(tc.id and tc.type == "function" for tc in calls)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    token_ids = [t for c in chunks if c.choices for t in c.choices[0].model_extra.get("token_ids") or []]
    assert len(token_ids) == chunks[-1].usage.completion_tokens
    assert '{"type": "function", "function": {"name": "get_weather"' in rendered(engine)


def test_tool_choice_none_renders_no_tools_and_parses_no_calls(qwen) -> None:
    url, engine = qwen
    engine.script(QWEN3_CALLS)
    got = openai_client(url).chat.completions.create(model="qwen", messages=ASK, tools=[WEATHER], tool_choice="none")
    assert got.choices[0].message.content == QWEN3_CALLS and not got.choices[0].message.tool_calls
    assert "# Tools" not in rendered(engine)


def test_bad_tool_requests_are_one_line_400s(qwen, synth_model) -> None:
    url, _ = qwen

    def post(**body) -> dict:
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": ASK, **body}, timeout=30)
        return assert_openai_error(r, 400)

    bad_args = [*ASK, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "get_weather", "arguments": "{city: Paris"}}]}]
    assert post(messages=bad_args)["param"] == "messages.1.tool_calls.0.function.arguments"
    not_object = [*ASK, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]
    assert "JSON object" in post(messages=not_object)["message"]
    assert post(tool_choice="required")["param"] == "tool_choice"  # forcing a call: tests/test_tool_choice.py
    assert post(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_time"}})["param"] \
        == "tool_choice.function.name"
    assert post(tools=[{"type": "function", "function": {"description": "no name"}}])["param"].startswith("tools.0")
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}

    plain = ScriptedEngine(Engine.load(synth_model("qwen3moe"), EngineConfig(n_ctx=256)))  # a template with no tools
    with live_server(create_app(plain, ServerConfig(model_id="plain"))) as plain_url:
        r = httpx.post(f"{plain_url}/v1/chat/completions", json={"messages": ASK, "tools": [WEATHER]}, timeout=30)
        error = assert_openai_error(r, 400)
    assert error["param"] == "tools" and "tool-call syntax" in error["message"]
