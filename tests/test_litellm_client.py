"""litellm against `runner serve` (issue 24's check names it beside the openai SDK and LangChain): its OpenAI
provider pointed at the server, plain and streamed completions, and a tool round in which the scripted model
writes the family's real call syntax and answers once the tool result comes back."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of its price map at import
import litellm  # noqa: E402
from test_langchain_agent import ANSWER, ASKED, QWEN3_CALL, TOOL_RESULT, assert_tool_turn_rendered  # noqa: E402
from test_tools import GLM_CALL, ZURICH_3, glm, qwen  # noqa: E402,F401  (glm, qwen: fixtures)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city, `days` days ahead.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}
ASK = [{"role": "user", "content": "Weather in Zürich for 3 days?"}]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(litellm, "telemetry", False, raising=False)
    monkeypatch.setattr(litellm, "num_retries", 0, raising=False)


@pytest.fixture(params=["qwen", "glm"])
def family(request: pytest.FixtureRequest):
    """(model id, base URL, scripted engine, the family's call to get_weather(Zürich, 3))."""
    url, engine = request.getfixturevalue(request.param)
    return request.param, url, engine, {"qwen": QWEN3_CALL, "glm": GLM_CALL}[request.param]


def complete(model_id: str, url: str, **kwargs):
    return litellm.completion(model=f"openai/{model_id}", api_base=f"{url}/v1", api_key="unused", timeout=60,
                              **kwargs)


def test_a_tool_round_through_litellm(family) -> None:
    model_id, url, engine, call = family
    engine.script(ASKED + call, ANSWER)
    asked = complete(model_id, url, messages=ASK, tools=[WEATHER])
    choice = asked.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look."
    (tool_call,) = choice.message.tool_calls
    assert tool_call.function.name == "get_weather" and json.loads(tool_call.function.arguments) == ZURICH_3
    history = [*ASK, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": tool_call.id, "content": TOOL_RESULT}]
    answered = complete(model_id, url, messages=history, tools=[WEATHER])
    assert answered.choices[0].message.content == ANSWER and not answered.choices[0].message.tool_calls
    assert answered.choices[0].finish_reason == "stop"
    assert answered.usage.prompt_tokens > asked.usage.prompt_tokens > 0
    assert_tool_turn_rendered(model_id, engine)


def test_streamed_text_and_usage_through_litellm(request: pytest.FixtureRequest) -> None:
    url, engine = request.getfixturevalue("qwen")
    engine.script(ANSWER)
    chunks = list(complete("qwen", url, messages=ASK, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    usage = [c.usage for c in chunks if getattr(c, "usage", None)]
    assert usage and usage[-1].completion_tokens > 0
