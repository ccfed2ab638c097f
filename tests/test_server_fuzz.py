"""Schemathesis over the live server's own OpenAPI schema: valid and invalid bodies alike get a
well-formed answer (never a 5xx; errors OpenAI-shaped), and the server still serves afterwards."""

from __future__ import annotations

import json

import httpx
import pytest
import schemathesis
import schemathesis.core.transport as schemathesis_transport
from hypothesis import HealthCheck, given, settings
from hypothesis.configuration import set_hypothesis_home_dir
from test_server_harness import serve_model

# A small context bounds every generation the fuzzer can ask for (max_tokens defaults to what is left).
N_CTX = 48
EXAMPLES_PER_OPERATION = 12
MAX_STREAM_EVENTS = getattr(schemathesis_transport, "DEFAULT_MAX_STREAM_EVENTS", 20)


@pytest.fixture(scope="module", autouse=True)
def hypothesis_home(tmp_path_factory):
    """Hypothesis caches constants on disk; keep that out of the working tree."""
    set_hypothesis_home_dir(tmp_path_factory.mktemp("hypothesis"))
    yield
    set_hypothesis_home_dir(None)  # back to the default (or HYPOTHESIS_STORAGE_DIRECTORY)


@pytest.fixture(scope="module")
def model_path(synth_model):
    return synth_model("glm4moe")


@pytest.fixture(scope="module")
def server(model_path):
    with serve_model(model_path, n_ctx=N_CTX) as (url, _):
        yield url


def check_response(response) -> None:
    assert response.status_code < 500, response.text
    assert "Traceback" not in response.text
    kinds = {k.lower(): v for k, v in response.headers.items()}.get("content-type", [""])  # schemathesis: lists
    kind = kinds[0] if isinstance(kinds, list) else kinds
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
    elif kind.startswith("text/event-stream") and response.text.startswith("event: "):
        check_named_events([e for e in response.text.split("\n\n") if e])
    elif kind.startswith("text/event-stream"):
        events = [e for e in response.text.split("\n\n") if e]
        # schemathesis stops reading a stream after MAX_STREAM_EVENTS events: only then may [DONE] be missing.
        done = events[-1] == "data: [DONE]"
        assert done or len(events) >= MAX_STREAM_EVENTS, response.text
        for event in events[: len(events) - done]:
            assert "error" not in json.loads(event.removeprefix("data: "))
    elif kind.startswith("application/json"):
        response.json()


# The Anthropic Messages and OpenAI Responses streams: named events, ending with their own last event.
LAST_EVENTS = {"message_stop", "response.completed", "response.incomplete"}


def check_named_events(events: list[str]) -> None:
    for event in events:
        name, data = event.split("\n", 1)
        body = json.loads(data.removeprefix("data: "))
        assert name == f"event: {body['type']}" and body["type"] != "error", event
    assert json.loads(events[-1].split("\n", 1)[1].removeprefix("data: "))["type"] in LAST_EVENTS or (
        len(events) >= MAX_STREAM_EVENTS), events[-1]


@pytest.mark.parametrize("mode", [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
def test_fuzzed_requests_get_well_formed_answers(server, model_path, mode) -> None:
    schema = schemathesis.openapi.from_url(f"{server}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions", "/tokenize", "/health"}
    if mode == schemathesis.GenerationMode.NEGATIVE:  # only request bodies can be made invalid here
        operations = [op for op in operations if op.method.upper() == "POST"]
    for operation in operations:
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def call(case) -> None:
            if mode == schemathesis.GenerationMode.POSITIVE and isinstance(case.body, dict) and "model" in case.body:
                case.body["model"] = model_path.stem  # else nearly every valid body is an (unknown model) 404
            check_response(case.call(base_url=server, timeout=30))

        call()
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}
    ok = httpx.post(f"{server}/v1/completions", json={"model": model_path.stem, "prompt": "still here", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 2
