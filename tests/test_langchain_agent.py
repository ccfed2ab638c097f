"""LangChain's tool-calling agent against `runner serve` (issue 24, item 1): ChatOpenAI pointed at the server,
LangChain's own agent loop running a real Python tool, and the scripted model writing the family's real call
syntax, then answering once the tool result comes back rendered by the model's template."""

from __future__ import annotations

from functools import reduce
from operator import add

import pytest
import tiktoken
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langchain_openai import ChatOpenAI
from test_tools import GLM_CALL, QWEN3_CALLS, ZURICH_3, glm, qwen, rendered  # noqa: F401  (glm, qwen: fixtures)

QWEN3_CALL = QWEN3_CALLS.split("\n<tool_call>")[0]  # the get_weather call alone
ASKED = "<think>The user wants the weather.</think>\nLet me look.\n"  # the model thinks, says a line, calls
ANSWER = "It will be 21 degrees in Zürich."
TOOL_RESULT = '{"temp": 21}'
# How each template renders the assistant's call and the tool turn that answers it, up to the generation prompt.
RENDERED = {
    "qwen": ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}\n</tool_call>',
             f"<|im_start|>user\n<tool_response>\n{TOOL_RESULT}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
    "glm": (GLM_CALL, f"<|observation|>\n<tool_response>\n{TOOL_RESULT}\n</tool_response><|assistant|>"),
}


@pytest.fixture(autouse=True)
def no_tiktoken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting tokens with tiktoken downloads its encodings; the agent loop must not need it."""
    def refuse(*_, **__):
        raise AssertionError("tiktoken was asked for an encoding (a network download)")
    monkeypatch.setattr(tiktoken, "get_encoding", refuse)
    monkeypatch.setattr(tiktoken, "encoding_for_model", refuse)
    monkeypatch.delenv("LANGSMITH_TRACING", raising=False)
    monkeypatch.delenv("LANGCHAIN_TRACING_V2", raising=False)


@pytest.fixture(params=["qwen", "glm"])
def family(request: pytest.FixtureRequest):
    """(model id, base URL, scripted engine, the family's call to get_weather(Zürich, 3))."""
    url, engine = request.getfixturevalue(request.param)
    return request.param, url, engine, {"qwen": QWEN3_CALL, "glm": GLM_CALL}[request.param]


def chat_model(model_id: str, url: str) -> ChatOpenAI:
    return ChatOpenAI(base_url=f"{url}/v1", api_key="unused", model=model_id, max_retries=0, timeout=60)


def weather_tool(ran: list[dict]) -> BaseTool:
    @tool
    def get_weather(city: str, days: int) -> str:
        """Weather for a city, `days` days ahead."""
        ran.append({"city": city, "days": days})
        return TOOL_RESULT
    return get_weather


def assert_tool_turn_rendered(model_id: str, engine) -> None:
    call, tool_turn = RENDERED[model_id]
    text = rendered(engine)
    assert call in text and text.endswith(tool_turn)


def test_create_agent_calls_the_tool_and_answers_with_its_result(family) -> None:
    model_id, url, engine, call = family
    engine.script(ASKED + call, ANSWER)
    ran: list[dict] = []
    agent = create_agent(chat_model(model_id, url), tools=[weather_tool(ran)])
    messages = agent.invoke({"messages": [HumanMessage("Weather in Zürich for 3 days?")]})["messages"]

    assert ran == [ZURICH_3]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    asked, answered = messages[1], messages[2]
    assert asked.content == "Let me look."
    assert [(c["name"], c["args"]) for c in asked.tool_calls] == [("get_weather", ZURICH_3)]
    assert answered.tool_call_id == asked.tool_calls[0]["id"] and answered.content == TOOL_RESULT
    assert messages[-1].content == ANSWER and not messages[-1].tool_calls
    assert messages[-1].response_metadata["finish_reason"] == "stop"
    assert_tool_turn_rendered(model_id, engine)


def test_streamed_tool_call_chunks_assemble_into_the_call(family) -> None:
    model_id, url, engine, call = family
    engine.script(ASKED + call, ANSWER)
    ran: list[dict] = []
    get_weather = weather_tool(ran)
    model = chat_model(model_id, url).bind_tools([get_weather])
    history: list = [HumanMessage("Weather in Zürich for 3 days?")]

    chunks = list(model.stream(history))
    asked = reduce(add, chunks)
    assert asked.content == "Let me look."
    assert [c["name"] for c in asked.tool_call_chunks] == ["get_weather"]
    assert [(c["name"], c["args"]) for c in asked.tool_calls] == [("get_weather", ZURICH_3)]
    assert asked.response_metadata["finish_reason"] == "tool_calls"

    history += [asked, *(get_weather.invoke(c) for c in asked.tool_calls)]  # a ToolCall in gives a ToolMessage out
    final = reduce(add, model.stream(history))
    assert ran == [ZURICH_3]
    assert final.content == ANSWER and not final.tool_call_chunks
    assert_tool_turn_rendered(model_id, engine)
