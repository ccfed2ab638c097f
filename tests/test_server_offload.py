"""`runner serve` with expert offload: a request's timings carry its own offload figures, /metrics moves by
exactly those, /props states the launch, and the output equals the all-resident server's."""

from __future__ import annotations

import httpx
import pytest
from test_server_harness import metric, metric_samples, serve_model

from runner.engine.engine import Engine
from runner.gguf_file import open_gguf
from runner.launch.resolve import LaunchOptions, resolve

BODY = {"messages": [{"role": "user", "content": "Tell me about the experts"}], "max_tokens": 10, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def path(synth_model):
    return synth_model("glm4moe", "Q8_0")


def _post(url: str) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions", json=BODY, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_offload_timings_metrics_and_props(path) -> None:
    plan = resolve(LaunchOptions(cache_slots="3", prefill_ubatch=8, ubatch=8, transaction="always", backend="numpy"),
                   open_gguf(path), 256)
    engine = Engine.load(path, plan.engine_config(256))
    with serve_model(path, engine=engine, launch=plan.to_dict()) as (url, _):
        props = httpx.get(f"{url}/props").json()
        assert props["launch"]["offload"]["cache_slots"] == 3 and props["offload"]["cache"]["slots_per_layer"] == 3
        before = metric_samples(url)
        got = _post(url)
        after = metric_samples(url)
        t = got["timings"]
        assert t["cache_hits"] + t["cache_misses"] > 0 and t["prefill_bytes"] > 0
        assert t["prefill_expert_sets"] == pytest.approx(1.0) and t["bytes_uploaded"] >= t["prefill_bytes"]

        def moved(name: str) -> float:
            return metric(after, name) - metric(before, name)

        assert moved("runner_generations_total") == 1  # the delta below belongs to this one request
        assert moved("runner_expert_cache_hits_total") == t["cache_hits"]
        assert moved("runner_expert_cache_misses_total") == t["cache_misses"]
        assert moved("runner_expert_bytes_uploaded_total") == t["bytes_uploaded"]
        assert moved("runner_prefill_expert_bytes_total") == t["prefill_bytes"]
        assert moved("runner_phase_begin_total") == moved("runner_phase_end_total") == 1
        assert moved("runner_phase_release_seconds_count") == 1
        second = _post(url)["timings"]  # the same prompt again: the figures are this request's, not totals
        assert second["cached_n"] > 0 and second["prefill_expert_sets"] == pytest.approx(1.0)
    with serve_model(path, n_ctx=256) as (url, _):
        resident = _post(url)
        assert resident["timings"]["bytes_uploaded"] == 0
        assert httpx.get(f"{url}/props").json()["offload"] is None
    assert got["choices"][0]["token_ids"] == resident["choices"][0]["token_ids"]


def test_serve_drafts_with_mtp_when_the_launch_says_so(path) -> None:
    plan = resolve(LaunchOptions(draft="mtp", draft_depth=2, backend="numpy"), open_gguf(path), 256)
    engine = Engine.load(path, plan.engine_config(256))
    with serve_model(path, engine=engine, draft=plan.draft) as (url, _):
        drafted = _post(url)
    with serve_model(path, n_ctx=256) as (url, _):
        plain = _post(url)
    assert drafted["timings"]["drafted_n"] > 0 and plain["timings"]["drafted_n"] == 0
    assert drafted["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
