"""One generation at a time: a bounded FIFO behind it, 429 beyond, and clients that leave free the engine."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from test_server_harness import GatedEngine, metric, metric_samples, openai_client, serve_model

from runner.engine.engine import Engine, EngineConfig

WAIT_S = 30  # upper bound on every wait below; each normally returns in milliseconds


@pytest.fixture(scope="module")
def model_path(synth_model):
    return synth_model("glm4moe")


def test_requests_run_in_arrival_order_and_overflow_gets_429(model_path) -> None:
    gated = GatedEngine(Engine.load(model_path, EngineConfig(n_ctx=256)))
    with serve_model(model_path, engine=gated, queue_size=2) as (url, app), ThreadPoolExecutor(3) as pool:
        scheduler, client = app.state.runner.scheduler, openai_client(url)

        def complete(first_token: int):
            return pool.submit(client.completions.create, model=model_path.stem, prompt=[first_token, 40, 41],
                               max_tokens=3, extra_body={"ignore_eos": True}, temperature=0)

        running = complete(100)
        assert gated.entered.wait(WAIT_S)  # the first one holds the engine, inside generate()
        waiting = []
        for depth, token in ((1, 101), (2, 102)):
            waiting.append(complete(token))
            assert scheduler.wait_until(lambda s, d=depth: s.depth == d, WAIT_S)
        with pytest.raises(openai.RateLimitError) as busy:
            client.completions.create(model=model_path.stem, prompt="one too many", max_tokens=1)
        assert busy.value.response.headers["retry-after"] == "1" and busy.value.code == "queue_full"
        gated.gate.set()
        results = [f.result(WAIT_S) for f in (running, *waiting)]
        assert [p[0] for p in gated.prompts] == [100, 101, 102]
        assert [r.usage.completion_tokens for r in results] == [3, 3, 3]
        assert [r.timings["queue_ms"] > 0 for r in results] == [True, True, True]
        samples = metric_samples(url)
        assert metric(samples, "runner_requests_total", endpoint="/v1/completions", status="429") == 1
        assert metric(samples, "runner_requests_total", endpoint="/v1/completions", status="200") == 3


def test_a_waiting_client_that_leaves_frees_its_place(model_path) -> None:
    gated = GatedEngine(Engine.load(model_path, EngineConfig(n_ctx=256)))
    with serve_model(model_path, engine=gated, queue_size=1) as (url, app), ThreadPoolExecutor(1) as pool:
        scheduler, client = app.state.runner.scheduler, openai_client(url)
        running = pool.submit(client.completions.create, model=model_path.stem, prompt="hold", max_tokens=2)
        assert gated.entered.wait(WAIT_S)
        body = f'{{"model": "{model_path.stem}", "prompt": "leaving", "max_tokens": 2}}'.encode()
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as conn:
            conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            assert scheduler.wait_until(lambda s: s.depth == 1, WAIT_S)
        assert scheduler.wait_until(lambda s: s.depth == 0, WAIT_S)  # closed: it left the queue
        gated.gate.set()
        assert running.result(WAIT_S).choices[0].finish_reason in ("stop", "length")
        assert [len(p) > 0 for p in gated.prompts] == [True]  # the departed request never reached the engine


def test_a_disconnect_mid_stream_stops_the_generation(model_path) -> None:
    max_tokens = 4000  # minutes of work if the disconnect went unnoticed
    with serve_model(model_path, n_ctx=4096) as (url, _):
        client = openai_client(url)
        before = metric_samples(url)
        stream = client.chat.completions.create(
            model=model_path.stem, messages=[{"role": "user", "content": "a long story"}], max_tokens=max_tokens,
            stream=True, extra_body={"ignore_eos": True, "return_token_ids": True})
        seen = 0
        for chunk in stream:
            seen += len(chunk.choices[0].token_ids) if chunk.choices else 0
            if seen >= 3:
                break
        stream.close()
        after_ok = client.chat.completions.create(model=model_path.stem, messages=[{"role": "user", "content": "next"}],
                                                  max_tokens=4, extra_body={"ignore_eos": True})
        assert after_ok.usage.completion_tokens == 4
        after = metric_samples(url)
        assert metric(after, "runner_generations_cancelled_total") - metric(before, "runner_generations_cancelled_total") == 1
        abandoned = (metric(after, "runner_completion_tokens_total") - metric(before, "runner_completion_tokens_total")
                     - after_ok.usage.completion_tokens)
        assert 3 <= abandoned < 200  # measured: about 5 (3 read, a couple decoded before the disconnect arrived)
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
