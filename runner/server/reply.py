"""A chat reply's text read as the model's family writes it: thinking, then content and tool calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.server.reasoning import ReasoningSplitter
from runner.server.tools import ParamTypes, Syntax, ToolCall, ToolCallParser

# ("reasoning_content", text), ("content", text) or ("tool_call", ToolCall)
Part = tuple[str, Any]


@dataclass(frozen=True)
class ReplySyntax:
    """How to read a reply. in_reasoning: None, no thinking split; True, the prompt opened <think>.
    tools: None, no tool calls looked for."""

    in_reasoning: bool | None = None
    tools: Syntax | None = None
    param_types: ParamTypes | None = None
    parallel_tool_calls: bool = True

    def parser(self) -> ReplyParser:
        return ReplyParser(self)


class ReplyParser:
    """Feed text with `push`, then `flush`; each returns the parts now certain, in order."""

    def __init__(self, syntax: ReplySyntax) -> None:
        self._thinking = ReasoningSplitter(syntax.in_reasoning) if syntax.in_reasoning is not None else None
        self._tools = (ToolCallParser(syntax.tools, syntax.param_types or {}, syntax.parallel_tool_calls)
                       if syntax.tools is not None else None)

    @property
    def calls(self) -> list[ToolCall]:
        return self._tools.calls if self._tools is not None else []

    def push(self, text: str) -> list[Part]:
        return self._route(self._thinking.push(text) if self._thinking else [("content", text)], final=False)

    def flush(self) -> list[Part]:
        return self._route(self._thinking.flush() if self._thinking else [], final=True)

    def _route(self, pieces: list[tuple[str, str]], final: bool) -> list[Part]:
        out: list[Part] = []
        for kind, text in pieces:
            if kind == "content" and self._tools is not None:
                out += self._tools.push(text)  # tool calls are looked for in the answer, not in the thinking
            else:
                out.append((kind, text))
        if final and self._tools is not None:
            out += self._tools.flush()
        return _merged(out)


def _merged(parts: list[Part]) -> list[Part]:
    """Adjacent text parts of one kind joined (one delta each)."""
    out: list[Part] = []
    for kind, value in parts:
        if out and kind == out[-1][0] and isinstance(value, str):
            out[-1] = (kind, out[-1][1] + value)
        else:
            out.append((kind, value))
    return out


def reply_parts(syntax: ReplySyntax, text: str) -> tuple[list[Part], list[ToolCall]]:
    """A whole reply's parts in order (adjacent text of one kind joined), and its tool calls."""
    parser = syntax.parser()
    return _merged(parser.push(text) + parser.flush()), parser.calls


def whole_reply(syntax: ReplySyntax, text: str) -> dict[str, Any]:
    """The assistant message of a whole reply: content (None when only tool calls), reasoning_content
    and tool_calls when present."""
    parts, calls = reply_parts(syntax, text)
    content = "".join(v for k, v in parts if k == "content")
    message: dict[str, Any] = {"role": "assistant", "content": content}
    reasoning = "".join(v for k, v in parts if k == "reasoning_content")
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [c.to_dict() for c in calls]
        message["content"] = content or None
    return message
