"""The OpenAI-compatible API against a live server over a tiny model, through the openai SDK and httpx."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from test_server_harness import live_server, metric, metric_samples, openai_client, serve_model

from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.server import ServerConfig, create_app

GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def model_path(synth_model):
    return synth_model("glm4moe")


@pytest.fixture(scope="module")
def server(model_path):
    with serve_model(model_path) as (url, app):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


@pytest.fixture(scope="module")
def model_id(model_path) -> str:
    return model_path.stem


def chat(client, model_id, content="Tell me about experts", **kwargs):
    return client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": content}], **kwargs)


def test_models_lists_the_file_stem(client, model_id) -> None:
    assert [m.id for m in client.models.list().data] == [model_id]
    assert client.models.retrieve(model_id).id == model_id


def test_chat_greedy_equals_engine_generate(client, model_id, model_path) -> None:
    engine = Engine.load(model_path, EngineConfig(n_ctx=4096))
    text = engine.tokenizer.render_chat([{"role": "user", "content": "Greedy parity"}])
    prompt = engine.tokenizer.encode(text, add_special=True, parse_special=True)
    want = engine.generate(prompt, 16, SamplingParams(temperature=0.0), ignore_eos=True).run()

    got = chat(client, model_id, "Greedy parity", max_tokens=16, extra_body={"return_token_ids": True, "ignore_eos": True},
               **GREEDY)
    choice = got.choices[0]
    assert got.prompt_token_ids == prompt
    assert choice.token_ids == want.tokens and choice.message.content == want.text
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(prompt), 16)
    assert got.usage.total_tokens == len(prompt) + 16
    timings = got.timings
    assert timings["predicted_n"] == 16 and timings["prompt_n"] + timings["cached_n"] == len(prompt)
    assert timings["prompt_ms"] > 0 and timings["predicted_ms"] > 0
    assert (timings["drafted_n"], timings["accepted_n"], timings["cache_hits"], timings["bytes_uploaded"]) == (0, 0, 0, 0)


def test_max_completion_tokens_is_honoured(client, model_id) -> None:
    got = chat(client, model_id, max_completion_tokens=3, extra_body={"ignore_eos": True}, **GREEDY)
    assert got.usage.completion_tokens == 3 and got.choices[0].finish_reason == "length"


def test_completion_of_text_and_of_token_ids_agree(client, model_id) -> None:
    by_text = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=10,
                                        extra_body={"return_token_ids": True, "ignore_eos": True}, **GREEDY)
    by_ids = client.completions.create(model=model_id, prompt=by_text.prompt_token_ids, max_tokens=10,
                                       extra_body={"return_token_ids": True, "ignore_eos": True}, **GREEDY)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.choices[0].token_ids == by_text.choices[0].token_ids and len(by_text.choices[0].token_ids) == 10
    assert by_text.object == "text_completion" and by_text.usage.completion_tokens == 10


def test_streamed_token_ids_add_up_to_usage(client, model_id) -> None:
    kwargs = dict(max_tokens=24, extra_body={"return_token_ids": True, "ignore_eos": True}, **GREEDY)
    whole = chat(client, model_id, "Stream me", **kwargs)
    chunks = list(chat(client, model_id, "Stream me", stream=True, stream_options={"include_usage": True}, **kwargs))
    usage_chunk, body = chunks[-1], chunks[:-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 24
    assert body[0].choices[0].delta.role == "assistant" and body[0].prompt_token_ids == whole.prompt_token_ids
    ids = [t for c in body for t in c.choices[0].token_ids]
    assert len(ids) == usage_chunk.usage.completion_tokens and ids == whole.choices[0].token_ids
    for c in body:  # visible text never arrives without its token ids
        assert not c.choices[0].delta.content or c.choices[0].token_ids
    assert "".join(c.choices[0].delta.content or "" for c in body) == whole.choices[0].message.content
    assert body[-1].choices[0].finish_reason == "length" and body[-1].timings["predicted_n"] == 24
    assert usage_chunk.usage.prompt_tokens_details.cached_tokens == usage_chunk.usage.prompt_tokens - 1


def test_streamed_completion_matches_whole(client, model_id) -> None:
    kwargs = dict(prompt="The cache", max_tokens=12, extra_body={"ignore_eos": True}, **GREEDY)
    whole = client.completions.create(model=model_id, **kwargs)
    chunks = list(client.completions.create(model=model_id, stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_sse_wire_format(server, model_id) -> None:
    body = {"model": model_id, "messages": [{"role": "user", "content": "wire"}], "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert {p["object"] for p in payloads} == {"chat.completion.chunk"} and len({p["id"] for p in payloads}) == 1
    assert payloads[-1]["usage"]["completion_tokens"] <= 5


def test_chat_logprobs(client, model_id) -> None:
    got = chat(client, model_id, max_tokens=6, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True}, **GREEDY)
    content = got.choices[0].logprobs.content
    assert len(content) == got.usage.completion_tokens == 6
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)  # greedy picks the most likely
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
    assert bytes(b for e in content for b in e.bytes).decode("utf-8", "replace") == got.choices[0].message.content


def test_completion_legacy_logprobs(client, model_id) -> None:
    got = client.completions.create(model=model_id, prompt="log", max_tokens=5, logprobs=2,
                                    extra_body={"ignore_eos": True}, **GREEDY)
    lp = got.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert all(len(top) <= 2 for top in lp.top_logprobs) and lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset)


def test_stop_string_cuts_the_text(client, model_id) -> None:
    full = client.completions.create(model=model_id, prompt="Stop here", max_tokens=24,
                                     extra_body={"ignore_eos": True}, **GREEDY).choices[0].text
    stop = full[6:9]
    cut = client.completions.create(model=model_id, prompt="Stop here", max_tokens=24, stop=[stop, "\x00never"],
                                    extra_body={"ignore_eos": True}, **GREEDY).choices[0]
    assert cut.finish_reason == "stop" and cut.text == full[: full.index(stop)]
    single = client.completions.create(model=model_id, prompt="Stop here", max_tokens=24, stop=stop,
                                       extra_body={"ignore_eos": True}, **GREEDY).choices[0]
    assert single.text == cut.text


def test_seed_reproduces_sampling(client, model_id) -> None:
    hot = dict(max_tokens=16, temperature=1.5, top_p=1.0, extra_body={"ignore_eos": True, "top_k": 0, "min_p": 0.0})
    runs = [chat(client, model_id, "Sample", seed=s, **hot).choices[0].message.content for s in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_follow_up_turn_reuses_the_cached_prefix(client, model_id) -> None:
    turn = [{"role": "user", "content": "A first question about caches"}]
    first = client.chat.completions.create(model=model_id, messages=turn, max_tokens=8, **GREEDY)
    turn += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "More?"}]
    second = client.chat.completions.create(model=model_id, messages=turn, max_tokens=4, **GREEDY)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # The whole first prompt is a prefix of the second one (the reply may re-tokenize differently).
    assert first.usage.prompt_tokens - 1 <= cached < second.usage.prompt_tokens
    assert second.timings["cached_n"] == cached


def test_metrics_move_by_exactly_one_request(server, client, model_id) -> None:
    before = metric_samples(server)
    got = chat(client, model_id, "Count me", max_tokens=5, extra_body={"ignore_eos": True}, **GREEDY)
    after = metric_samples(server)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("runner_requests_total", endpoint="/v1/chat/completions", status="200") == 1
    assert delta("runner_prompt_tokens_total") == got.usage.prompt_tokens
    assert delta("runner_cached_prompt_tokens_total") == got.usage.prompt_tokens_details.cached_tokens
    assert delta("runner_completion_tokens_total") == got.usage.completion_tokens == 5
    for name in ("runner_time_to_first_token_seconds_count", "runner_prefill_seconds_count", "runner_decode_seconds_count"):
        assert delta(name) == 1
    assert delta("runner_prefill_seconds_sum") == pytest.approx(got.timings["prompt_ms"] / 1e3, rel=1e-6)
    assert metric(after, "runner_queue_depth") == 0
    for name in ("runner_phase_begin_total", "runner_phase_end_total", "runner_phase_failure_total",
                 "runner_expert_cache_hits_total", "runner_expert_bytes_uploaded_total"):
        assert (name, ()) in after and metric(after, name) == 0


def test_tokenize_round_trip(server, model_id) -> None:
    text = "Experts, <|user|> and caches"
    tokens = httpx.post(f"{server}/tokenize", json={"content": text}).json()["tokens"]
    assert all(isinstance(t, int) for t in tokens)
    assert httpx.post(f"{server}/detokenize", json={"tokens": tokens}).json() == {"content": text}
    special = httpx.post(f"{server}/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
    assert special[-len(tokens):] == tokens and len(special) >= len(tokens)
    pieces = httpx.post(f"{server}/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens and "".join(p["piece"] for p in pieces) == text


def test_health_is_ok(server) -> None:
    r = httpx.get(f"{server}/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_health_while_loading_and_when_unhealthy(model_path) -> None:
    app = create_app(None, ServerConfig(model_id=model_path.stem))
    with live_server(app) as url:
        loading = httpx.get(f"{url}/health")
        assert loading.status_code == 503 and loading.json()["status"] == "loading" and loading.json()["reason"]
        refused = httpx.post(f"{url}/v1/completions", json={"model": model_path.stem, "prompt": "hi"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "loading"
        app.state.runner.attach(Engine.load(model_path, EngineConfig(n_ctx=256)))
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        done = httpx.post(f"{url}/v1/completions", json={"model": model_path.stem, "prompt": "hi", "max_tokens": 2})
        assert done.status_code == 200
        app.state.runner.mark_unhealthy("the prefill phase transaction failed")
        sick = httpx.get(f"{url}/health")
        assert sick.status_code == 503
        assert sick.json() == {"status": "unhealthy", "reason": "the prefill phase transaction failed"}


def test_roles_go_through_the_models_own_template(client, model_id) -> None:
    developer = client.chat.completions.create(model=model_id, max_tokens=2, messages=[
        {"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert developer.usage.completion_tokens <= 2  # "developer" is rendered as the template's system role
    # The tool role reaches the template, which decides: the synthetic GLM template knows no "tool" role.
    with pytest.raises(openai.BadRequestError, match="unsupported role: tool"):
        client.chat.completions.create(model=model_id, messages=[{"role": "tool", "content": "42", "tool_call_id": "1"}])
