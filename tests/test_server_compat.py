"""What clients written for llama-server or other OpenAI servers send, answered as they expect (issue 24,
item 5): any model name, several prompts, n_predict, seed -1, repeat_penalty, logit_bias, CORS, X-Api-Key,
cache_n."""

from __future__ import annotations

import subprocess
import sys

import httpx
import numpy as np
import pytest
from test_server_harness import assert_openai_error, live_server, openai_client, serve_model

from runner.engine.engine import Engine, EngineConfig
from runner.engine.generation import penalised
from runner.engine.sampling import SamplingParams
from runner.errors import ServeError
from runner.server import ServerConfig, create_app

N_CTX = 96
GREEDY = {"temperature": 0, "ignore_eos": True}
WEB_PAGE = "http://localhost:3000"


@pytest.fixture(scope="module")
def model_path(synth_model):
    return synth_model("qwen3moe")


@pytest.fixture(scope="module")
def engine(model_path):
    return Engine.load(model_path, EngineConfig(n_ctx=N_CTX))


@pytest.fixture(scope="module")
def server(model_path, engine):
    with serve_model(model_path, engine=engine) as (url, _):
        yield url


def complete(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"max_tokens": 4, **GREEDY, **body}, timeout=60)


def test_any_model_name_reaches_the_one_model_and_responses_name_it(server, model_path) -> None:
    client = openai_client(server)
    got = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=2)
    assert got.model == model_path.stem and got.usage.completion_tokens <= 2
    assert complete(server, prompt="hi", model="whatever/you-named-it").status_code == 200


def test_alias_is_listed_and_any_name_still_works(model_path, engine) -> None:
    app = create_app(engine, ServerConfig(model_id="glm-4.5-air"))  # what runner serve --alias glm-4.5-air makes
    with live_server(app) as url:
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["glm-4.5-air"]
        body = complete(url, prompt="hi", model="qwen").json()
    assert body["model"] == "glm-4.5-air" and body["choices"][0]["text"]


def test_a_list_of_prompts_gives_one_choice_each_in_order(server) -> None:
    alone = [complete(server, prompt=p).json() for p in ("first prompt", "a second one")]
    both = complete(server, prompt=["first prompt", "a second one"], return_token_ids=True).json()
    assert [c["index"] for c in both["choices"]] == [0, 1]
    assert [c["text"] for c in both["choices"]] == [a["choices"][0]["text"] for a in alone]
    assert both["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert both["usage"]["completion_tokens"] == 8 and len(both["timings"]) == 2
    assert both["prompt_token_ids"] == [c["prompt_token_ids"] for c in
                                        (complete(server, prompt=p, return_token_ids=True).json() for p in
                                         ("first prompt", "a second one"))]
    by_ids = complete(server, prompt=both["prompt_token_ids"]).json()
    assert [c["text"] for c in by_ids["choices"]] == [c["text"] for c in both["choices"]]
    assert complete(server, prompt=["first prompt"]).json()["choices"][0]["text"] == alone[0]["choices"][0]["text"]


def test_several_prompts_refused_when_streamed_too_many_or_one_too_long(server) -> None:
    streamed = assert_openai_error(complete(server, prompt=["a", "b"], stream=True), 400)
    assert streamed["param"] == "prompt" and "without streaming" in streamed["message"]
    assert assert_openai_error(complete(server, prompt=["a"] * 17), 400)["param"] == "prompt"
    too_long = assert_openai_error(complete(server, prompt=[[1, 2], [1] * N_CTX]), 400)
    assert too_long["code"] == "context_length_exceeded"


def test_n_predict_is_max_tokens_and_minus_one_runs_to_the_context_end(server) -> None:
    assert complete(server, prompt="hi", max_tokens=None, n_predict=3).json()["usage"]["completion_tokens"] == 3
    assert complete(server, prompt="hi", max_tokens=2, n_predict=5).json()["usage"]["completion_tokens"] == 2
    endless = complete(server, prompt="hi", max_tokens=None, n_predict=-1).json()
    assert endless["usage"]["total_tokens"] == N_CTX and endless["choices"][0]["finish_reason"] == "length"
    assert assert_openai_error(complete(server, prompt="hi", n_predict=-2), 400)["param"] == "n_predict"


def test_seed_minus_one_is_random_and_other_seeds_reproduce(server) -> None:
    def sample(seed: int) -> str:
        hot = {"temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "max_tokens": 16}
        return complete(server, prompt="Sample", seed=seed, **hot).json()["choices"][0]["text"]

    assert sample(7) == sample(7)
    assert len({sample(-1) for _ in range(3)}) > 1


def test_repeat_penalty_pushes_seen_tokens_toward_zero() -> None:
    logits = np.array([2.0, -2.0, 1.0, 3.0], dtype=np.float32)
    out = penalised(logits, {0: 1, 1: 2}, SamplingParams(repeat_penalty=2.0))
    assert out.tolist() == [1.0, -4.0, 1.0, 3.0]
    assert penalised(logits, {0: 1}, SamplingParams()) is logits  # 1 is off


def test_repeat_penalty_reaches_the_sampler(server, engine) -> None:
    prompt = engine.tokenizer.encode("repeat after me", add_special=True, parse_special=True)
    penalty = SamplingParams(temperature=0.0, repeat_penalty=1.8)
    want = engine.generate(prompt, 24, penalty, ignore_eos=True).run().tokens
    got = complete(server, prompt=prompt, max_tokens=24, repeat_penalty=1.8, return_token_ids=True).json()
    assert got["choices"][0]["token_ids"] == want
    for bad in (0, -1.0, 11):
        assert assert_openai_error(complete(server, prompt="hi", repeat_penalty=bad), 400)["param"] == "repeat_penalty"


def test_logit_bias_comes_before_the_penalties_as_in_llama_cpp() -> None:
    logits = np.array([1.0, 2.0, 0.5], dtype=np.float32)
    biased = SamplingParams(repeat_penalty=2.0, logit_bias=((0, -3.0), (2, 1.5)))
    assert penalised(logits, {}, biased).tolist() == [-2.0, 2.0, 2.0]
    assert penalised(logits, {0: 1}, biased).tolist() == [-4.0, 2.0, 2.0]  # penalty first would give -2.5
    assert logits.tolist() == [1.0, 2.0, 0.5]  # the caller's logits are not touched


def test_logit_bias_steers_greedy_decoding(server, engine) -> None:
    prompt = engine.tokenizer.encode("repeat after me", add_special=True, parse_special=True)
    plain = complete(server, prompt=prompt, max_tokens=8, return_token_ids=True).json()["choices"][0]["token_ids"]
    banned = {str(plain[0]): -100}
    want = engine.generate(prompt, 8, SamplingParams(temperature=0.0, logit_bias=((plain[0], -100.0),)),
                           ignore_eos=True).run().tokens
    got = complete(server, prompt=prompt, max_tokens=8, logit_bias=banned, return_token_ids=True).json()
    assert got["choices"][0]["token_ids"] == want and plain[0] not in want
    chat = openai_client(server).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0,
        logit_bias={"7": 100}, extra_body={"return_token_ids": True, "ignore_eos": True})
    assert chat.choices[0].model_extra["token_ids"] == [7, 7, 7]


@pytest.mark.parametrize("bias", [{"hello": 1}, {"-1": 1}, {"99999999": 1}, {"5": 101}, {"5": -100.5}])
def test_a_bad_logit_bias_is_a_one_line_400(server, bias) -> None:
    error = assert_openai_error(complete(server, prompt="hi", logit_bias=bias), 400)
    assert error["param"] == "logit_bias" and "\n" not in error["message"]


def test_timings_name_the_reused_prefix_cache_n_as_llama_server(server) -> None:
    complete(server, prompt="a prefix shared by two requests")
    second = complete(server, prompt="a prefix shared by two requests and more").json()
    assert second["timings"]["cache_n"] == second["timings"]["cached_n"] > 0


def test_cors_is_off_by_default(server) -> None:
    preflight = httpx.options(f"{server}/v1/chat/completions",
                              headers={"Origin": WEB_PAGE, "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in preflight.headers
    get = httpx.get(f"{server}/v1/models", headers={"Origin": WEB_PAGE})
    assert get.status_code == 200 and "access-control-allow-origin" not in get.headers


def test_cors_origin_and_x_api_key(model_path, engine) -> None:
    with serve_model(model_path, engine=engine, api_key="sesame", cors_origins=(WEB_PAGE,)) as (url, _):
        preflight = httpx.options(f"{url}/v1/chat/completions", headers={
            "Origin": WEB_PAGE, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == WEB_PAGE
        refused = httpx.get(f"{url}/v1/models", headers={"Origin": WEB_PAGE})  # no key: the page can read why
        assert_openai_error(refused, 401)
        assert refused.headers["access-control-allow-origin"] == WEB_PAGE
        other = httpx.get(f"{url}/v1/models", headers={"Origin": "http://evil.example", "X-Api-Key": "sesame"})
        assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
        assert httpx.get(f"{url}/v1/models", headers={"X-Api-Key": "sesame"}).status_code == 200
        assert httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer sesame"}).status_code == 200
        assert_openai_error(httpx.get(f"{url}/v1/models", headers={"X-Api-Key": "nope"}), 401)


@pytest.mark.parametrize("origin", ["localhost:3000", "http://host/path", ""])
def test_a_cors_value_that_is_not_an_origin_is_refused(origin: str) -> None:
    with pytest.raises(ServeError, match="not an origin"):
        ServerConfig(model_id="m", cors_origins=(origin,))
    assert ServerConfig(model_id="m", cors_origins=("*", "https://app.example:8443")).cors_origins


def test_serve_cors_flag_with_a_bad_origin_is_one_error_line(model_path) -> None:
    done = subprocess.run([sys.executable, "-m", "runner.cli", "serve", str(model_path), "--port", "0",
                           "--cors", "localhost:3000"], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "not an origin" in done.stderr
