"""OpenAI's Responses API on the chat path (issue 24 item 5): input as a string or messages, instructions,
max_output_tokens, text.format structured output and the streaming events, over plain HTTP and through
the openai SDK, against the demo model."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from test_server_harness import assert_openai_error, openai_client, serve_model

from runner.package_data import demo_model_path

ASK = [{"role": "user", "content": "What is curl?"}]


@pytest.fixture(scope="module")
def server():
    with serve_model(demo_model_path(), n_ctx=512) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def _chat_text(client, messages: list[dict], max_tokens: int) -> str:
    got = client.chat.completions.create(model="demo", messages=messages, max_tokens=max_tokens, temperature=0)
    return got.choices[0].message.content


def test_a_string_input_with_instructions_is_the_chat_reply(client) -> None:
    got = client.responses.create(model="any", input="What is curl?", instructions="Be brief.", max_output_tokens=12,
                                  temperature=0)
    assert got.object == "response" and got.id.startswith("resp_") and got.model == "demo"
    assert got.output_text == _chat_text(client, [{"role": "system", "content": "Be brief."}, *ASK], 12)
    assert got.status == "incomplete" and got.incomplete_details.reason == "max_output_tokens"
    assert got.usage.output_tokens == 12 and got.usage.total_tokens == got.usage.input_tokens + 12


def test_message_input_with_content_parts_and_a_finished_reply(server, client) -> None:
    conversation = [{"role": "user", "content": [{"type": "input_text", "text": "What is git?"}]},
                    {"role": "assistant", "content": [{"type": "output_text", "text": "A version control system."}]},
                    {"type": "message", "role": "user", "content": "What is curl?"}]
    r = httpx.post(f"{server}/v1/responses", json={"input": conversation, "max_output_tokens": 300, "temperature": 0},
                   timeout=60)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "completed" and body["incomplete_details"] is None
    (item,) = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["status"] == "completed"
    want = _chat_text(client, [{"role": "user", "content": "What is git?"},
                               {"role": "assistant", "content": "A version control system."}, *ASK], 300)
    assert item["content"] == [{"type": "output_text", "text": want, "annotations": []}]


def test_the_stream_sends_the_responses_events_in_order(server, client) -> None:
    with httpx.stream("POST", f"{server}/v1/responses", json={"input": "What is curl?", "max_output_tokens": 8,
                                                              "temperature": 0, "stream": True}, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    events = []
    for name, data in zip(lines[::2], lines[1::2]):
        body = json.loads(data.removeprefix("data: "))
        assert name == f"event: {body['type']}"
        events.append(body)
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == events[-4]["text"] == _chat_text(client, ASK, 8)
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == text


def test_the_sdk_stream_ends_with_the_whole_response(client) -> None:
    stream = client.responses.create(model="demo", input=ASK, max_output_tokens=300, temperature=0, stream=True)
    events = list(stream)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == deltas == _chat_text(client, ASK, 300)


def test_text_format_json_schema_constrains_the_output(client) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "free": {"type": "boolean"}},
              "required": ["name", "free"], "additionalProperties": False}
    got = client.responses.create(model="demo", input="What is curl?", max_output_tokens=80, temperature=0.7,
                                  text={"format": {"type": "json_schema", "name": "package", "schema": schema,
                                                   "strict": True}})
    jsonschema.validate(json.loads(got.output_text), schema)
    assert got.status == "completed"


@pytest.mark.parametrize("body, param", [
    ({}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ({"input": "hi", "tools": [{"type": "function", "name": "f"}]}, "tools"),  # the demo template has no tool syntax
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
])
def test_what_is_not_served_is_a_one_line_400(server, body, param) -> None:
    error = assert_openai_error(httpx.post(f"{server}/v1/responses", json=body, timeout=30), 400)
    assert error["param"].startswith(param) and "\n" not in error["message"]
