"""Anthropic's Messages API on the chat path (issue 24 item 5): system, text blocks, max_tokens,
stop_sequences, structured output and Anthropic's stream events, over plain HTTP and through the
anthropic SDK, against the demo model."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest
from test_server_harness import assert_openai_error, openai_client, serve_model

from runner.package_data import demo_model_path

ASK = [{"role": "user", "content": "What is curl?"}]
GREEDY = {"temperature": 0}  # in extra_body: recent anthropic SDKs have no temperature argument


@pytest.fixture(scope="module")
def server():
    with serve_model(demo_model_path(), n_ctx=512) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0, timeout=60)


def _chat_text(server: str, messages: list[dict], max_tokens: int, **extra) -> str:
    """What /v1/chat/completions answers to the same conversation, greedy."""
    got = openai_client(server).chat.completions.create(model="demo", messages=messages, max_tokens=max_tokens,
                                                         temperature=0, **extra)
    return got.choices[0].message.content


def test_a_message_is_the_chat_reply_as_one_text_block(server) -> None:
    r = httpx.post(f"{server}/v1/messages", json={"model": "claude-any", "max_tokens": 12, "system": "Be brief.",
                                                  "messages": [{"role": "user", "content": [
                                                      {"type": "text", "text": "What is "}, {"type": "text", "text": "curl?"}]}],
                                                  **GREEDY}, timeout=60)
    body = r.json()
    assert r.status_code == 200 and body["type"] == "message" and body["role"] == "assistant"
    assert body["id"].startswith("msg_") and body["model"] == "demo"
    want = _chat_text(server, [{"role": "system", "content": "Be brief."}, *ASK], 12)
    assert body["content"] == [{"type": "text", "text": want}]
    assert body["stop_reason"] == "max_tokens" and body["stop_sequence"] is None
    assert body["usage"]["output_tokens"] == 12 and body["usage"]["input_tokens"] > 0


def test_the_sdk_reads_a_stop_sequence_and_the_end_of_turn(client, server) -> None:
    full = _chat_text(server, ASK, 40)
    stop = full.split()[2]  # a word the greedy reply reaches
    got = client.messages.create(model="demo", max_tokens=40, messages=ASK, stop_sequences=[stop], extra_body=GREEDY)
    assert got.stop_reason == "stop_sequence" and got.stop_sequence == stop
    assert got.content[0].text == full[: full.index(stop)]
    ended = client.messages.create(model="demo", max_tokens=300, messages=ASK, extra_body=GREEDY)
    assert ended.stop_reason == "end_turn" and ended.content[0].text


def test_the_stream_sends_anthropics_events_in_order(server) -> None:
    events = []
    with httpx.stream("POST", f"{server}/v1/messages", json={"max_tokens": 8, "messages": ASK, "stream": True, **GREEDY},
                      timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    for name, data in zip(lines[::2], lines[1::2]):
        body = json.loads(data.removeprefix("data: "))
        assert name == f"event: {body['type']}"
        events.append(body)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == _chat_text(server, ASK, 8)
    assert events[-2]["delta"]["stop_reason"] == "max_tokens" and events[-2]["usage"]["output_tokens"] == 8


def test_the_sdk_stream_gives_the_whole_message(client, server) -> None:
    with client.messages.stream(model="demo", max_tokens=10, messages=ASK, extra_body=GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == final.content[0].text == _chat_text(server, ASK, 10)
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 10


def test_output_config_constrains_the_reply_to_a_schema(client) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}}, "required": ["name"],
              "additionalProperties": False}
    output_config = {"format": {"type": "json_schema", "schema": schema}}  # in extra_body: older SDKs lack it
    got = client.messages.create(model="demo", max_tokens=60, messages=ASK,
                                 extra_body={**GREEDY, "output_config": output_config})
    jsonschema.validate(json.loads(got.content[0].text), schema)
    assert got.stop_reason == "end_turn"


@pytest.mark.parametrize("body, param", [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content"),
    ({"max_tokens": 5, "messages": ASK, "tools": [{"name": "f", "input_schema": {}}]}, "tools"),  # no tool syntax
    ({"max_tokens": 5, "messages": ASK, "temperature": 1.5}, "temperature"),
])
def test_what_is_not_served_is_a_one_line_400(server, body, param) -> None:
    error = assert_openai_error(httpx.post(f"{server}/v1/messages", json=body, timeout=30), 400)
    assert error["param"].startswith(param) and "\n" not in error["message"]
