"""The prompt cache through the server (issue 24 item 4): conversations A, B, A through the openai SDK on
the demo model, plain and with MTP; the third request reports A's restored tokens as cached_tokens and in
timings. `--cache-ram` is GiB, 0 turns it off, a negative or non-number is one error line."""

from __future__ import annotations

import pytest
from test_cli_bad_input import assert_one_error_line, runner_bytes
from test_server_harness import metric, metric_samples, openai_client, serve_model

from runner.cli.serve import cache_ram_line
from runner.engine.engine import Engine, EngineConfig
from runner.package_data import demo_model_path
from runner.spec.config import DraftConfig

A = [{"role": "user", "content": "What does curl do?"}]
B = [{"role": "user", "content": "Which package provides the git command, and what is it for?"}]


@pytest.fixture(scope="module", params=["plain", "mtp"])
def server(request):
    demo = demo_model_path()
    draft = DraftConfig("mtp") if request.param == "mtp" else None
    engine = Engine.load(demo, EngineConfig(n_ctx=512, prompt_cache_bytes=1 << 30))
    with serve_model(demo, engine=engine, draft=draft) as (url, _):
        yield url


def test_switching_back_to_a_conversation_reports_its_restored_prompt_as_cached(server) -> None:
    client = openai_client(server)

    def ask(messages: list[dict]) -> object:
        return client.chat.completions.create(model="demo", messages=messages, max_tokens=12, temperature=0)

    before = metric(metric_samples(server), "runner_restored_prompt_tokens_total")
    first = ask(A)
    other = ask(B)
    assert other.usage.prompt_tokens_details.cached_tokens < other.usage.prompt_tokens // 2  # only the template's head
    third = ask([*A, {"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And wget?"}])
    cached = third.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens <= cached < third.usage.prompt_tokens  # at least A's whole first prompt
    timings = third.model_extra["timings"]
    assert timings["cache_n"] == timings["cache_restored_n"] == cached
    assert timings["prompt_n"] == third.usage.prompt_tokens - cached
    assert metric(metric_samples(server), "runner_restored_prompt_tokens_total") - before == cached


@pytest.mark.parametrize("value", ["-1", "nan", "lots"])
def test_a_cache_ram_that_is_not_a_size_is_one_error_line(value: str) -> None:
    done = runner_bytes("serve", str(demo_model_path()), "--port", "0", "--backend", "numpy", "--cache-ram", value)
    assert_one_error_line(done, "invalid value for '--cache-ram'")


def test_the_start_up_line_says_the_budget_and_that_the_unit_is_gib() -> None:
    assert cache_ram_line(0) == "prompt cache: off (--cache-ram 0)"
    assert "up to 8 GiB of host RAM" in cache_ram_line(8)
    assert "llama-server's --cache-ram is MiB" in cache_ram_line(8192 * 1024)
