"""Stored responses on OpenAI's Responses API (issue 24 item 5): `store` (on by default), `previous_response_id`
continuing a stored conversation exactly as if the client had sent it whole, `item_reference` items, and
retrieve / delete / input_items through the openai SDK; the store's byte budget and eviction."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from test_server_harness import assert_openai_error, openai_client

from runner.server.errors import APIError
from runner.server.response_store import ResponseStore

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city", "parameters": SCHEMA}
QWEN3_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Bern"}}\n</tool_call>'


@pytest.fixture(scope="module")
def qwen(scripted_qwen3):
    url, engine = scripted_qwen3
    return openai_client(url), engine


def _ask(client, **kw):
    return client.responses.create(model="demo", max_output_tokens=6, temperature=0, **kw)


def test_previous_response_id_continues_as_the_whole_conversation_would(demo_client) -> None:
    first = _ask(demo_client, input="What is curl?", instructions="Be brief.")
    assert first.store is True and first.previous_response_id is None
    second = _ask(demo_client, input="And git?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    # OpenAI's rule: the previous response's instructions are not carried over
    whole = _ask(demo_client, store=False, input=[{"role": "user", "content": "What is curl?"},
                                             {"role": "assistant", "content": first.output_text},
                                             {"role": "user", "content": "And git?"}])
    assert second.output_text == whole.output_text and second.usage.input_tokens == whole.usage.input_tokens
    third = _ask(demo_client, input="And ssh?", previous_response_id=second.id)
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens


def test_retrieve_returns_the_stored_response_and_store_false_keeps_nothing(demo_client) -> None:
    kept = _ask(demo_client, input="What is curl?", metadata={"k": "v"})
    got = demo_client.responses.retrieve(kept.id)
    assert got.model_dump() == kept.model_dump()
    gone = _ask(demo_client, input="What is curl?", store=False)
    assert gone.store is False
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        demo_client.responses.retrieve(gone.id)
    with pytest.raises(openai.BadRequestError, match="no stored response"):
        _ask(demo_client, input="And git?", previous_response_id=gone.id)


def test_a_streamed_response_is_stored_when_it_completes(demo_client) -> None:
    events = list(demo_client.responses.create(model="demo", input="What is curl?", max_output_tokens=5, temperature=0,
                                          stream=True))
    final = events[-1].response
    assert demo_client.responses.retrieve(final.id).output_text == final.output_text != ""


def test_delete_leaves_later_links_of_the_chain_whole(demo_client) -> None:
    first = _ask(demo_client, input="What is curl?")
    second = _ask(demo_client, input="And git?", previous_response_id=first.id)
    deleted = demo_client.responses.delete(first.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        demo_client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        demo_client.responses.delete(first.id)
    # the second response keeps its whole conversation: continuing it still sees the first turn
    third = _ask(demo_client, input="And ssh?", previous_response_id=second.id)
    whole = _ask(demo_client, store=False, input=[{"role": "user", "content": "What is curl?"},
                                             {"role": "assistant", "content": first.output_text},
                                             {"role": "user", "content": "And git?"},
                                             {"role": "assistant", "content": second.output_text},
                                             {"role": "user", "content": "And ssh?"}])
    assert third.output_text == whole.output_text and third.usage.input_tokens == whole.usage.input_tokens


def test_input_items_lists_the_conversation_and_pages(demo_client) -> None:
    first = _ask(demo_client, input="What is curl?")
    second = _ask(demo_client, input="And git?", previous_response_id=first.id)
    items = demo_client.responses.input_items.list(second.id, order="asc").data
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant"), ("message", "user")]
    assert items[0].content[0].text == "What is curl?" and items[1].id == first.output[0].id
    assert items[1].content[0].text == first.output_text and items[2].content[0].text == "And git?"
    newest_first = demo_client.responses.input_items.list(second.id).data  # OpenAI's default order: desc
    assert [i.id for i in newest_first] == [i.id for i in reversed(items)]
    page = demo_client.responses.input_items.list(second.id, order="asc", limit=1, after=items[0].id)
    assert [i.id for i in page.data] == [items[1].id] and page.has_more
    assert [i.id for i in demo_client.responses.input_items.list(second.id, order="asc", limit=2)] == [i.id for i in items]


def test_item_reference_stands_for_the_stored_item(demo_client) -> None:
    first = _ask(demo_client, input="What is curl?")
    (asked,) = demo_client.responses.input_items.list(first.id).data
    by_reference = _ask(demo_client, store=False, input=[{"type": "item_reference", "id": asked.id},
                                                    {"type": "item_reference", "id": first.output[0].id},
                                                    {"role": "user", "content": "And git?"}])
    whole = _ask(demo_client, store=False, input=[{"role": "user", "content": "What is curl?"},
                                             {"role": "assistant", "content": first.output_text},
                                             {"role": "user", "content": "And git?"}])
    assert by_reference.output_text == whole.output_text
    assert by_reference.usage.input_tokens == whole.usage.input_tokens


def test_a_tool_round_continues_from_the_stored_call(qwen) -> None:
    client, engine = qwen
    engine.script(QWEN3_CALL)
    asked = client.responses.create(model="m", input="Weather in Bern?", tools=[WEATHER])
    (call,) = asked.output
    engine.script("Sunny.")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"sky": "sunny"})}
    client.responses.create(model="m", previous_response_id=asked.id, input=[result], tools=[WEATHER])
    continued = engine.prompts[-1]
    engine.script("Sunny.")
    replay = {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments}
    client.responses.create(model="m", store=False, tools=[WEATHER],
                            input=[{"role": "user", "content": "Weather in Bern?"}, replay, result])
    assert engine.prompts[-1] == continued
    assert "<tool_response>" in engine.tokenizer.decode(continued)


@pytest.mark.parametrize("path, method, status", [
    ("/v1/responses/resp_missing", "GET", 404),
    ("/v1/responses/resp_missing", "DELETE", 404),
    ("/v1/responses/resp_missing/input_items", "GET", 404),
])
def test_an_unknown_id_is_a_one_line_404(demo_server, path, method, status) -> None:
    r = httpx.request(method, demo_server + path, timeout=30)
    error = assert_openai_error(r, status)
    assert "resp_missing" in error["message"] and "\n" not in error["message"]


@pytest.mark.parametrize("body, param", [
    ({"input": [{"type": "item_reference", "id": "msg_missing"}]}, "input.0"),
    ({"input": "hi", "previous_response_id": "resp_missing"}, "previous_response_id"),
])
def test_a_missing_reference_is_a_one_line_400(demo_server, body, param) -> None:
    r = httpx.post(f"{demo_server}/v1/responses", json=body, timeout=30)
    error = assert_openai_error(r, 400)
    assert error["param"] == param and "\n" not in error["message"]


def test_input_items_paging_arguments_are_checked(demo_server, demo_client) -> None:
    first = _ask(demo_client, input="What is curl?")
    base = f"{demo_server}/v1/responses/{first.id}/input_items"
    for query, param in (("limit=0", "limit"), ("order=up", "order"), ("after=msg_x", "after")):
        error = assert_openai_error(httpx.get(f"{base}?{query}", timeout=30), 400)
        assert error["param"] == param


def _response(rid: str, text: str) -> dict:
    return {"id": rid, "output": [{"type": "message", "id": f"msg_{rid}", "role": "assistant",
                                   "content": [{"type": "output_text", "text": text}]}]}


def test_the_store_evicts_least_recently_used_within_its_budget() -> None:
    one = _response("a", "x" * 300)
    store = ResponseStore(max_bytes=1000)
    store.put(one, [{"type": "message", "id": "in_a", "role": "user", "content": "q"}])
    store.put(_response("b", "y" * 300), [])
    store.get("a")  # now the most recently used
    store.put(_response("c", "z" * 300), [])
    with pytest.raises(APIError, match="'b'"):
        store.get("b")
    assert store.get("a").response is one and store.item("in_a", "input.0")["content"] == "q"
    with pytest.raises(APIError):
        store.item("msg_b", "input.0")  # an evicted response's items go with it
    store.put(_response("huge", "h" * 2000), [])  # larger than the budget: not kept, nothing evicted for it
    assert store.get("a") and store.get("c")
    with pytest.raises(APIError):
        store.get("huge")


def test_an_item_shared_by_two_conversations_outlives_either() -> None:
    store = ResponseStore(max_bytes=1 << 20)
    first = _response("a", "hi")
    store.put(first, [])
    store.put(_response("b", "there"), store.get("a").conversation())
    store.delete("a")
    assert store.item("msg_a", "input.0")["content"][0]["text"] == "hi"
    store.delete("b")
    with pytest.raises(APIError):
        store.item("msg_a", "input.0")
