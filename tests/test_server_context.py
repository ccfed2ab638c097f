"""An agent-sized max_tokens against a small context: generation stops at the context end with
finish_reason "length" (as llama-server's does); only a prompt that leaves no room is refused."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import openai
import pytest
from test_server_harness import assert_openai_error, openai_client, serve_model

from runner.engine.engine import Engine, EngineConfig
from runner.package_data import demo_model_path

N_CTX = 48
AGENT_MAX_TOKENS = 4096  # what coding agents typically ask for


@pytest.fixture(scope="module")
def demo():
    path = demo_model_path()
    assert path is not None, "the embedded demo model is missing"
    return path


@pytest.fixture(scope="module")
def server(demo):
    engine = Engine.load(demo, EngineConfig(n_ctx=N_CTX))
    with serve_model(demo, engine=engine) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def test_chat_max_tokens_past_the_context_stops_at_its_end(client, demo) -> None:
    got = client.chat.completions.create(model=demo.stem, messages=[{"role": "user", "content": "What does curl do?"}],
                                         max_tokens=AGENT_MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})
    assert got.choices[0].finish_reason == "length"
    assert got.usage.prompt_tokens + got.usage.completion_tokens == N_CTX
    assert got.usage.completion_tokens > 0 and got.choices[0].message.content


def test_streamed_completion_past_the_context_stops_at_its_end(client, demo) -> None:
    chunks = list(client.completions.create(model=demo.stem, prompt="curl is", max_tokens=AGENT_MAX_TOKENS,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True, "return_token_ids": True}))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert finishes == ["length"]
    assert usage.prompt_tokens + usage.completion_tokens == N_CTX
    streamed_ids = [t for c in chunks if c.choices for t in (c.choices[0].model_extra or {}).get("token_ids", [])]
    assert len(streamed_ids) == usage.completion_tokens


def test_max_tokens_within_the_room_is_kept(client, demo) -> None:
    got = client.completions.create(model=demo.stem, prompt="curl is", max_tokens=3, extra_body={"ignore_eos": True})
    assert got.usage.completion_tokens == 3 and got.choices[0].finish_reason == "length"


def test_only_a_prompt_leaving_no_room_is_refused_and_the_server_stays_healthy(server, client, demo) -> None:
    with pytest.raises(openai.BadRequestError) as full:
        client.completions.create(model=demo.stem, prompt=list(range(1, N_CTX + 1)), max_tokens=AGENT_MAX_TOKENS)
    assert full.value.code == "context_length_exceeded" and full.value.param == "prompt"
    assert f"exceeds the context ({N_CTX})" in full.value.message
    long_chat = {"model": demo.stem, "max_tokens": 1, "messages": [{"role": "user", "content": "curl " * N_CTX}]}
    error = assert_openai_error(httpx.post(f"{server}/v1/chat/completions", json=long_chat, timeout=30), 400)
    assert error["param"] == "messages" and "\n" not in error["message"]
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}


def test_runner_generate_stops_at_the_context_end(demo) -> None:
    done = subprocess.run([sys.executable, "-m", "runner.cli", "generate", str(demo), "-p", "curl is", "-n",
                           str(AGENT_MAX_TOKENS), "-c", "16", "--ignore-eos", "--temperature", "0", "--json"],
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["prompt_tokens"] + out["completion_tokens"] == 16 and out["finish_reason"] == "length"
