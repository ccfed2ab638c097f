"""Tool calls in a model's reply, in the syntax its family was trained on, turned into OpenAI `tool_calls`.

Three syntaxes, each recognised from the chat template that teaches it:

- GLM-4.5/4.6: `<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>...</tool_call>`
- Qwen3 (Hermes): `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>`
- Qwen3-Coder / Qwen3.5: `<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>...</function>\\n</tool_call>`

GLM and the XML form write a string argument bare and anything else as JSON, so a value is read as
JSON unless the tool's schema says the parameter is a string (as llama.cpp's parsers do). A call that
does not parse stays in the content, as the model wrote it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from runner.engine.stopping import partial_suffix

START_TAG = "<tool_call>"
END_TAG = "</tool_call>"

Syntax = Literal["glm", "qwen3", "qwen3_xml"]
ParamTypes = dict[str, dict[str, Any]]  # tool name -> parameter name -> its JSON schema type


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it
    id: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


Event = tuple[Literal["content"], str] | tuple[Literal["tool_call"], ToolCall]


def template_syntax(template: str | None) -> Syntax | None:
    """The tool-call syntax a chat template teaches its model; None if it teaches none this server reads."""
    if template is None or START_TAG not in template:
        return None
    if "<arg_key>" in template:
        return "glm"
    if "<function=" in template:
        return "qwen3_xml"
    return "qwen3"


def param_types(tools: list[dict[str, Any]]) -> ParamTypes:
    """Each tool's parameters and their declared types, from the request's `tools`."""
    out: ParamTypes = {}
    for tool in tools:
        function = tool.get("function") or {}
        properties = (function.get("parameters") or {}).get("properties") or {}
        out[function.get("name", "")] = {k: (v or {}).get("type") for k, v in properties.items() if isinstance(v, dict)}
    return out


def _value(raw: str, declared: Any) -> Any:
    if declared == "string":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # a bare word where the schema wanted something else: keep what the model wrote


_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _parse_glm(body: str, types: ParamTypes) -> tuple[str, dict[str, Any]] | None:
    name, _, rest = body.partition("<arg_key>")
    name = name.strip()
    if not name or "\n" in name or "<" in name:
        return None
    rest = "<arg_key>" + rest if rest else ""
    args = {k.strip(): _value(v, types.get(name, {}).get(k.strip())) for k, v in _GLM_ARG.findall(rest)}
    if _GLM_ARG.sub("", rest).strip():
        return None  # something besides argument pairs
    return name, args


def _parse_qwen3(body: str, types: ParamTypes) -> tuple[str, dict[str, Any]] | None:
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    args = call.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string, as OpenAI sends them
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return (call["name"], args) if isinstance(args, dict) else None


def _parse_qwen3_xml(body: str, types: ParamTypes) -> tuple[str, dict[str, Any]] | None:
    match = _XML_FUNCTION.fullmatch(body.strip())
    if match is None:
        return None
    name, inner = match.group(1).strip(), match.group(2)
    args = {k.strip(): _value(v, types.get(name, {}).get(k.strip())) for k, v in _XML_PARAM.findall(inner)}
    if _XML_PARAM.sub("", inner).strip():
        return None
    return name, args


_PARSERS: dict[Syntax, Callable[[str, ParamTypes], tuple[str, dict[str, Any]] | None]] = {
    "glm": _parse_glm, "qwen3": _parse_qwen3, "qwen3_xml": _parse_qwen3_xml}


class ToolCallParser:
    """Feed content with `push`, then `flush`; each returns the events now certain: content text (a
    possible start of a call held back) and whole tool calls. Whitespace around calls is dropped."""

    def __init__(self, syntax: Syntax, types: ParamTypes, parallel: bool = True) -> None:
        self._parse = _PARSERS[syntax]
        self._types = types
        self._parallel = parallel
        self._held = ""  # text not yet emitted: a possible start tag, a call in progress, trailing whitespace
        self._in_call = False
        self._gap = ""  # the whitespace before the call in progress: back in the content if it is no call
        self.calls: list[ToolCall] = []

    def push(self, text: str) -> list[Event]:
        self._held += text
        out: list[Event] = []
        while True:
            if self._in_call:
                end = self._held.find(END_TAG)
                if end < 0:
                    return out
                body, self._held = self._held[:end], self._held[end + len(END_TAG):]
                self._in_call = False
                out += self._call(body)
                continue
            start = self._held.find(START_TAG)
            if start < 0:
                # Hold a possible start of the tag, and the whitespace before it (dropped if a call follows).
                sure = self._held[:len(self._held) - partial_suffix(self._held, START_TAG)].rstrip()
                out += self._content(sure)
                self._held = self._held[len(sure):]
                return out
            before = self._held[:start].rstrip()  # whitespace before a call is dropped
            out += self._content(before)
            self._gap = self._held[len(before):start]
            self._held, self._in_call = self._held[start + len(START_TAG):], True

    def flush(self) -> list[Event]:
        held, self._held = self._held, ""
        if self._in_call:  # cut off inside a call (max_tokens): the text as written
            self._in_call = False
            return self._content(self._gap + START_TAG + held)
        return self._content(held if not self.calls else held.rstrip())

    def _content(self, text: str) -> list[Event]:
        if self.calls and not text.strip():
            return []
        return [("content", text)] if text else []

    def _call(self, body: str) -> list[Event]:
        parsed = self._parse(body, self._types)
        if parsed is None:
            return self._content(self._gap + START_TAG + body + END_TAG)
        if self.calls and not self._parallel:
            return []  # parallel_tool_calls: false keeps the first call only
        name, args = parsed
        call = ToolCall(name, json.dumps(args, ensure_ascii=False), f"call_{uuid.uuid4().hex[:24]}")
        self.calls.append(call)
        return [("tool_call", call)]


def parse_tool_calls(text: str, syntax: Syntax, types: ParamTypes, parallel: bool = True) -> tuple[str, list[ToolCall]]:
    """(content, tool calls) of a whole reply."""
    parser = ToolCallParser(syntax, types, parallel)
    events = parser.push(text) + parser.flush()
    return "".join(e[1] for e in events if e[0] == "content"), parser.calls

