"""Function tools on OpenAI's Responses API (issue 24): tools and function_call / function_call_output items
rendered through the model's own template exactly as the chat path renders them, the family's tool calls as
function_call output items (whole, and streamed as the openai SDK parses and accumulates them), reasoning
items, tool_choice by constrained decoding, and one-line 400s. Replies are scripted in Qwen3's real syntax."""

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

TEMPLATES = Path(__file__).parent / "templates"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
          "required": ["city"]}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city", "parameters": SCHEMA}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                 "parameters": SCHEMA}}
ZURICH_3 = {"city": "Zürich", "days": 3}
QWEN3_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}\n</tool_call>'
ASK = "Weather in Zürich for 3 days?"


@pytest.fixture(scope="module")
def qwen(scripted_qwen3):
    return scripted_qwen3


def test_a_call_is_a_function_call_output_item(qwen) -> None:
    url, engine = qwen
    engine.script("I will check.\n" + QWEN3_CALL)
    got = openai_client(url).responses.create(model="m", input=ASK, tools=[WEATHER])
    message, call = got.output
    assert message.type == "message" and got.output_text == "I will check."
    assert call.type == "function_call" and call.name == "get_weather" and json.loads(call.arguments) == ZURICH_3
    assert call.id.startswith("fc_") and call.call_id.startswith("call_") and call.status == "completed"
    assert got.status == "completed" and got.tools[0].name == "get_weather" and got.tool_choice == "auto"
    responses_prompt = engine.prompts[-1]
    engine.script("")
    openai_client(url).chat.completions.create(model="m", messages=[{"role": "user", "content": ASK}],
                                               tools=[CHAT_WEATHER])
    assert engine.prompts[-1] == responses_prompt


def test_the_sdk_stream_sends_function_call_events(qwen) -> None:
    url, engine = qwen
    engine.script("I will check.\n" + QWEN3_CALL)
    events = list(openai_client(url).responses.create(model="m", input=ASK, tools=[WEATHER], stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-8:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, delta, done, item_done = events[-5:-1]
    assert added.output_index == 1 and added.item.type == "function_call" and added.item.arguments == ""
    assert delta.item_id == done.item_id == added.item.id == item_done.item.id
    assert json.loads(delta.delta) == json.loads(done.arguments) == ZURICH_3
    assert item_done.item.status == "completed" and item_done.item.call_id == added.item.call_id
    final = events[-1].response
    assert [o.type for o in final.output] == ["message", "function_call"] and final.output[1].id == added.item.id


def test_the_sdk_stream_helper_accumulates_the_call(qwen) -> None:
    url, engine = qwen
    engine.script(QWEN3_CALL + "\n" + QWEN3_CALL.replace("Zürich", "Bern"))
    with openai_client(url).responses.stream(model="m", input=ASK, tools=[WEATHER]) as stream:
        final = stream.get_final_response()
    assert [(o.type, json.loads(o.arguments)["city"]) for o in final.output] == [("function_call", "Zürich"),
                                                                                ("function_call", "Bern")]


def test_a_function_call_output_round_trip_renders_as_the_chat_tool_turn(qwen) -> None:
    url, engine = qwen
    client = openai_client(url)
    engine.script("I will check.\n" + QWEN3_CALL)
    first = client.responses.create(model="m", input=ASK, tools=[WEATHER], instructions="Be brief.")
    call = first.output[1]
    engine.script("It will be 21 degrees.")
    conversation = [{"role": "user", "content": ASK}, *[o.model_dump(exclude_none=True) for o in first.output],
                    {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'}]
    second = client.responses.create(model="m", input=conversation, tools=[WEATHER], instructions="Be brief.")
    assert second.output_text == "It will be 21 degrees." and [o.type for o in second.output] == ["message"]
    responses_prompt = engine.prompts[-1]
    engine.script("")
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK},
            {"role": "assistant", "content": "I will check.", "tool_calls": [
                {"id": call.call_id, "type": "function", "function": {"name": "get_weather", "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": '{"temp": 21}'}]
    client.chat.completions.create(model="m", messages=chat, tools=[CHAT_WEATHER])
    assert responses_prompt == engine.prompts[-1]
    assert '<tool_response>\n{"temp": 21}\n</tool_response>' in engine.tokenizer.decode(responses_prompt)


def test_thinking_is_a_reasoning_item_and_replays_as_the_turns_thinking(qwen) -> None:
    url, engine = qwen
    client = openai_client(url)
    engine.script("<think>\nThe user wants weather.\n</think>\n\n" + QWEN3_CALL)
    first = client.responses.create(model="m", input=ASK, tools=[WEATHER])
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "\nThe user wants weather.\n"
    assert call.type == "function_call"
    engine.script("Sunny.")
    conversation = [{"role": "user", "content": ASK}, *[o.model_dump(exclude_none=True) for o in first.output],
                    {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    client.responses.create(model="m", input=conversation, tools=[WEATHER])
    responses_prompt = engine.prompts[-1]
    engine.script("")
    chat = [{"role": "user", "content": ASK},
            {"role": "assistant", "content": "", "reasoning_content": "\nThe user wants weather.\n", "tool_calls": [
                {"id": call.call_id, "type": "function", "function": {"name": "get_weather", "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}]
    client.chat.completions.create(model="m", messages=chat, tools=[CHAT_WEATHER])
    assert responses_prompt == engine.prompts[-1]


def test_required_and_a_named_function_force_a_valid_call(synth_model) -> None:
    engine = Engine(open_gguf(synth_model("qwen3moe")), EngineConfig(n_ctx=4096),
                    chat_template=(TEMPLATES / "qwen3.jinja").read_text())
    time_tool = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}
    with live_server(create_app(engine, ServerConfig(model_id="m"))) as url:
        client = openai_client(url)
        for choice in ("required", {"type": "function", "name": "get_time"}):
            got = client.responses.create(model="m", input=ASK, tools=[time_tool], tool_choice=choice,
                                          parallel_tool_calls=False, max_output_tokens=300, temperature=1.0)
            assert [o.type for o in got.output] == ["function_call"] and got.output[0].name == "get_time"
            jsonschema.validate(json.loads(got.output[0].arguments), time_tool["parameters"])


CALL = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": json.dumps(ZURICH_3)}


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"type": "function", "parameters": SCHEMA}]}, "tools.0.name"),
    ({"tool_choice": {"type": "function", "name": "get_time"}}, "tool_choice.name"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required", "tools": None}, "tool_choice"),
    ({"input": [{"role": "user", "content": ASK}, CALL]}, "input.1"),
    ({"input": [{"role": "user", "content": ASK}, {**CALL, "arguments": "{city: Bern"}]}, "input.1.arguments"),
    ({"input": [{"role": "user", "content": ASK}, {**CALL, "arguments": "[1]"}]}, "input.1.arguments"),
    ({"input": [{"role": "user", "content": ASK}, {"type": "function_call_output", "output": "x"}]}, "input.1"),
    ({"input": [{"type": "item_reference", "id": "fc_1"}]}, "input.0"),  # nothing is stored to refer to
])
def test_bad_tool_requests_are_one_line_400s(qwen, body, param) -> None:
    url, _ = qwen
    request = {"input": ASK, "tools": [WEATHER], "max_output_tokens": 5, **body}
    error = assert_openai_error(httpx.post(f"{url}/v1/responses", json=request, timeout=30), 400)
    assert error["param"].startswith(param) and "\n" not in error["message"]


def test_streamed_thinking_is_a_reasoning_item_the_sdk_reads(qwen) -> None:
    url, engine = qwen
    engine.script("<think>\nWeather.\n</think>\n\nSunny.")
    events = list(openai_client(url).responses.create(model="m", input=ASK, stream=True))
    kinds = [k for i, k in enumerate(e.type for e in events) if i == 0 or k != events[i - 1].type]  # runs as one
    assert kinds[2:7] == ["response.output_item.added", "response.reasoning_text.delta", "response.reasoning_text.done",
                          "response.output_item.done", "response.output_item.added"]
    assert events[2].item.type == "reasoning"
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "\nWeather.\n"
    engine.script("<think>\nWeather.\n</think>\n\nSunny.")
    with openai_client(url).responses.stream(model="m", input=ASK) as stream:
        final = stream.get_final_response()
    reasoning, message = final.output
    assert reasoning.content[0].text == "\nWeather.\n" and final.output_text == "Sunny."
