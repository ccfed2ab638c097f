"""Bad input gets an OpenAI-shaped error with the right status, never a traceback, and the server stays healthy."""

from __future__ import annotations

import httpx
import openai
import pytest
from test_server_harness import assert_openai_error, openai_client, serve_model

N_CTX = 64


@pytest.fixture(scope="module")
def model_path(synth_model):
    return synth_model("qwen3moe")


@pytest.fixture(scope="module")
def server(model_path):
    with serve_model(model_path, n_ctx=N_CTX) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


@pytest.fixture(autouse=True)
def still_healthy(server):
    yield
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}


def post(server: str, path: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{server}{path}", timeout=30, **kwargs)


def test_malformed_json(server) -> None:
    r = post(server, "/v1/chat/completions", content=b'{"model": "x", "messages": [', headers={"content-type": "application/json"})
    assert "not valid JSON" in assert_openai_error(r, 400)["message"]
    form = post(server, "/v1/completions", content=b"model=x", headers={"content-type": "application/x-www-form-urlencoded"})
    assert "JSON object" in assert_openai_error(form, 400)["message"]
    assert assert_openai_error(post(server, "/v1/completions", json=[1, 2]), 400)["param"] is None
    assert assert_openai_error(post(server, "/tokenize"), 400)["message"] == "the request body is missing"


def test_missing_and_wrong_typed_fields(server, model_path) -> None:
    missing = assert_openai_error(post(server, "/v1/chat/completions", json={"model": model_path.stem}), 400)
    assert missing["param"] == "messages" and missing["type"] == "invalid_request_error"
    body = {"model": model_path.stem, "prompt": "hi", "temperature": "hot"}
    assert assert_openai_error(post(server, "/v1/completions", json=body), 400)["param"] == "temperature"
    role = {"model": model_path.stem, "messages": [{"role": "wizard", "content": "hi"}]}
    assert assert_openai_error(post(server, "/v1/chat/completions", json=role), 400)["param"] == "messages.0.role"
    nan = post(server, "/v1/completions", content=b'{"model": "m", "prompt": "x", "top_p": NaN}',
               headers={"content-type": "application/json"})
    assert assert_openai_error(nan, 400)["param"] == "top_p"


def test_sdk_errors(client, model_path) -> None:
    model = model_path.stem
    hello = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError) as unknown:  # generation takes any name; a lookup is exact
        client.models.retrieve("gpt-4o")
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="n = 1"):
        client.chat.completions.create(model=model, messages=hello, n=2)
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=model, prompt=list(range(1, N_CTX + 1)), max_tokens=1)
    assert too_long.value.code == "context_length_exceeded" and "exceeds the context (64)" in too_long.value.message
    assert too_long.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model=model, messages=[])
    assert empty.value.param == "messages"
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.completions.create(model=model, prompt=[1, 10**6], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        client.completions.create(model=model, prompt="hi", presence_penalty=3)
    with pytest.raises(openai.BadRequestError, match="teaches no tool-call syntax"):  # the synthetic template
        client.chat.completions.create(model=model, messages=hello, tools=[{"type": "function", "function": {"name": "f"}}])
    for nothing in ([], ""):  # the schema says so too (minItems, minLength)
        with pytest.raises(openai.BadRequestError, match="at least 1") as empty_prompt:
            client.completions.create(model=model, prompt=nothing)
        assert empty_prompt.value.param == "prompt"
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs"):
        client.chat.completions.create(model=model, messages=hello, top_logprobs=2)


def test_a_streaming_request_refused_before_it_starts_gets_its_status(client, model_path) -> None:
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        list(client.completions.create(model=model_path.stem, prompt=[10**6], max_tokens=2, stream=True))


def test_prompt_filling_the_context_is_refused_and_default_max_tokens_fills_it(client, model_path) -> None:
    got = client.completions.create(model=model_path.stem, prompt="hi", extra_body={"ignore_eos": True})
    assert got.usage.prompt_tokens + got.usage.completion_tokens == N_CTX and got.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="exceeds the context"):
        client.completions.create(model=model_path.stem, prompt=list(range(1, N_CTX + 1)))


def test_settings_the_sampler_would_choke_on_are_normalised(client, model_path) -> None:
    def run(**kwargs):
        return client.completions.create(model=model_path.stem, prompt="edge", max_tokens=6,
                                         extra_body={"ignore_eos": True}, **kwargs).choices[0].text

    # numpy wants a non-negative seed; OpenAI allows any integer (but -1, llama.cpp's "random").
    assert run(seed=-5, temperature=1.0) == run(seed=-5, temperature=1.0)
    # logits / 5e-324 overflows to inf and NaN probabilities; a temperature that small means greedy.
    assert run(temperature=5e-324) == run(temperature=0)


def test_unknown_routes_methods_and_tokens(server) -> None:
    assert_openai_error(httpx.get(f"{server}/v1/nothing"), 404)
    assert_openai_error(httpx.get(f"{server}/v1/chat/completions"), 405)
    assert "out of range" in assert_openai_error(post(server, "/detokenize", json={"tokens": [10**6]}), 400)["message"]
    surrogate = post(server, "/tokenize", content=b'{"content": "\\ud800"}', headers={"content-type": "application/json"})
    assert assert_openai_error(surrogate, 400)["param"] == "content"


def test_api_key(model_path) -> None:
    with serve_model(model_path, n_ctx=N_CTX, api_key="sesame") as (url, _):
        with pytest.raises(openai.AuthenticationError):
            openai_client(url, api_key="wrong").models.list()
        assert_openai_error(httpx.get(f"{url}/v1/models"), 401)
        # The key is checked before the body is read: a malformed body without a key is still a 401.
        assert_openai_error(httpx.post(f"{url}/v1/completions", content=b"{"), 401)
        assert_openai_error(httpx.get(f"{url}/metrics"), 401)
        assert httpx.get(f"{url}/health").status_code == 200
        good = openai_client(url, api_key="sesame")
        assert good.completions.create(model=model_path.stem, prompt="hi", max_tokens=2).usage.completion_tokens <= 2


def test_model_field_may_be_omitted_as_in_llama_cpp(server, model_path) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = post(server, "/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["model"] == model_path.stem
