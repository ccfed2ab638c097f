"""OpenAI's Responses API (POST /v1/responses), stateless, mapped onto the chat path: `input` (a string or
items) after `instructions` becomes a chat request (function_call items as an assistant turn's tool calls,
function_call_output items as tool turns); the reply is read as chat replies are and becomes output items
(reasoning, message, function_call), streamed as the API's named events (response.created ... .completed)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import Field

from runner.engine.generation import Generation, Step
from runner.server.errors import APIError
from runner.server.formats import Format, named_event
from runner.server.reply import Part, ReplySyntax, reply_parts
from runner.server.schemas import (ChatCompletionRequest, ChatMessage, FunctionCall, FunctionDef, JSONSchemaFormat,
                                   NamedFunction, NamedToolChoice, ResponseFormat, Tool, ToolCallIn, _Body)
from runner.server.tools import ToolCall


class InputText(_Body):
    type: Literal["input_text", "output_text"]  # a replayed assistant turn carries output_text
    text: str


class InputMessage(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: str
    name: str = Field(min_length=1)
    arguments: str  # a JSON object, as the output item carried it


class FunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]


class ReasoningText(_Body):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Body):
    """A replayed reasoning item: its text becomes the next assistant turn's thinking."""

    type: Literal["reasoning"]
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None


InputItem = InputMessage | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class FunctionTool(_Body):
    type: str  # "function"; hosted tools (web_search, file_search, ...) are not served
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # accepted; a forced call always follows the schema


class FunctionChoice(_Body):
    type: Literal["function"]
    name: str


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextOptions(_Body):
    format: TextFormat | None = None


class Reasoning(_Body):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None


class ResponsesRequest(_Body):
    model: str | None = None  # any name reaches the one model served
    input: str | list[InputItem] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    text: TextOptions | None = None
    reasoning: Reasoning | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool | None = None  # accepted; nothing is stored
    metadata: dict[str, str] | None = None

    def to_chat(self) -> ChatCompletionRequest:
        """The same conversation as a chat request: instructions as the system turn, then the input."""
        if self.previous_response_id is not None:
            raise APIError(400, "responses are not stored: send the whole conversation as input",
                           param="previous_response_id")
        turns = [ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        if isinstance(self.input, str):
            turns.append(ChatMessage(role="user", content=self.input))
        else:
            turns += _turns(self.input)
        if turns[-1].tool_calls:
            raise APIError(400, "the input ends with a function_call: answer it with a function_call_output item",
                           param=f"input.{len(self.input) - 1}")
        choice = self.tool_choice
        return ChatCompletionRequest(messages=turns, max_tokens=self.max_output_tokens, temperature=self.temperature,
                                     top_p=self.top_p, stream=self.stream, response_format=self._response_format(),
                                     reasoning_effort=self.reasoning.effort if self.reasoning else None,
                                     tools=self._tools(), parallel_tool_calls=self.parallel_tool_calls,
                                     tool_choice=NamedToolChoice(type="function", function=NamedFunction(
                                         name=choice.name)) if isinstance(choice, FunctionChoice) else choice)

    def _tools(self) -> list[Tool] | None:
        for i, tool in enumerate(self.tools or []):
            if tool.type != "function":
                raise APIError(400, f"tools.{i}: {tool.type!r} is a hosted tool; only function tools are served",
                               param=f"tools.{i}.type")
            if not tool.name:
                raise APIError(400, f"tools.{i}: a function tool needs a name", param=f"tools.{i}.name")
        return [Tool(type="function", function=FunctionDef(name=t.name or "", description=t.description,
                                                           parameters=t.parameters, strict=t.strict))
                for t in self.tools] if self.tools else None

    def _response_format(self) -> ResponseFormat | None:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type != "json_schema":
            return ResponseFormat(type=fmt.type) if fmt is not None else None
        schema = JSONSchemaFormat(name=fmt.name, schema=fmt.schema_, strict=fmt.strict)
        return ResponseFormat(type="json_schema", json_schema=schema)


def _arguments(item: FunctionCallItem, where: str) -> dict[str, Any]:
    try:
        arguments = json.loads(item.arguments)
    except ValueError as exc:
        raise APIError(400, f"{where}.arguments is not valid JSON: {exc}", param=f"{where}.arguments") from None
    if not isinstance(arguments, dict):
        raise APIError(400, f"{where}.arguments must be a JSON object", param=f"{where}.arguments")
    return arguments


def _turns(items: list[InputItem]) -> list[ChatMessage]:
    """Input items as chat turns: function_call items join the assistant turn they follow (or open one), each
    function_call_output is a tool turn, a reasoning item is the next assistant turn's thinking."""
    turns: list[ChatMessage] = []
    thinking = ""
    for i, item in enumerate(items):
        if isinstance(item, ReasoningItem):
            thinking += "".join(p.text for p in (item.content if item.content is not None else item.summary))
        elif isinstance(item, FunctionCallOutputItem):
            turns.append(ChatMessage(role="tool", tool_call_id=item.call_id, content=_text(item.output)))
        elif isinstance(item, FunctionCallItem):
            call = ToolCallIn(id=item.call_id, function=FunctionCall(name=item.name, arguments=_arguments(item, f"input.{i}")))
            if turns and turns[-1].role == "assistant" and not thinking:
                turns[-1].tool_calls = [*(turns[-1].tool_calls or []), call]
            else:
                turns.append(ChatMessage(role="assistant", tool_calls=[call], reasoning_content=thinking or None))
                thinking = ""
        elif item.role == "assistant":
            turns.append(ChatMessage(role="assistant", content=_text(item.content), reasoning_content=thinking or None))
            thinking = ""
        else:
            turns.append(ChatMessage(role=item.role, content=_text(item.content)))
    return turns


def _text(content: str | list[InputText]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _Item:
    """An output item as it is streamed: its id, its place in `output`, and its text so far."""

    def __init__(self, kind: str, index: int, call: ToolCall | None = None) -> None:
        self.kind, self.index, self.call = kind, index, call
        self.id = _new_id({"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind])
        self.text = ""

    def body(self, done: bool) -> dict[str, Any]:
        status = "completed" if done else "in_progress"
        if self.kind == "function_call":
            assert self.call is not None
            return {"type": "function_call", "id": self.id, "call_id": self.call.id, "name": self.call.name,
                    "arguments": self.call.arguments if done else "", "status": status}
        if self.kind == "reasoning":
            content = [{"type": "reasoning_text", "text": self.text}] if done else []
            return {"type": "reasoning", "id": self.id, "summary": [], "content": content, "status": status}
        content = [_output_text(self.text)] if done else []
        return {"type": "message", "id": self.id, "status": status, "role": "assistant", "content": content}


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


_KINDS = {"content": "message", "reasoning_content": "reasoning", "tool_call": "function_call"}


class ResponsesFormat(Format):
    prefix, object_name = "resp", "response"

    def __init__(self, *args: Any, request: ResponsesRequest, reply: ReplySyntax, **kwargs: Any) -> None:
        super().__init__(*args, return_token_ids=False, logprobs=None, **kwargs)
        self.request, self.reply = request, reply
        self.id = self.id.replace("-", "_")
        self._parser = reply.parser()
        self._items: list[_Item] = []
        self._open: _Item | None = None  # the message or reasoning item being streamed
        self._sequence = 0

    def _response(self, gen: Generation | None, items: list[_Item]) -> dict[str, Any]:
        r = self.request
        status, incomplete = "in_progress", None
        if gen is not None:
            status = "incomplete" if gen.finish_reason == "length" else "completed"
            incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        text_format = r.text.format.model_dump(by_alias=True, exclude_none=True) if r.text and r.text.format else {
            "type": "text"}
        tool_choice = r.tool_choice.model_dump() if isinstance(r.tool_choice, FunctionChoice) else r.tool_choice
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": [item.body(done=True) for item in items],
                "incomplete_details": incomplete, "error": None, "instructions": r.instructions,
                "max_output_tokens": r.max_output_tokens, "temperature": r.temperature, "top_p": r.top_p,
                "parallel_tool_calls": r.parallel_tool_calls, "tool_choice": tool_choice or "auto",
                "tools": [t.model_dump(exclude_none=True) for t in r.tools or []], "text": {"format": text_format},
                "metadata": r.metadata or {}, "usage": _usage(gen) if gen is not None else None,
                "completed_at": int(time.time()) if status == "completed" else None}

    def response(self, steps: list[Step], gen: Generation, queued_s: float) -> dict[str, Any]:
        items = []
        for kind, value in reply_parts(self.reply, gen.text)[0]:
            item = _Item(_KINDS[kind], len(items), value if kind == "tool_call" else None)
            item.text = value if isinstance(value, str) else ""
            items.append(item)
        return self._response(gen, items)

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self._sequence += 1
        return {"type": kind, "sequence_number": self._sequence - 1, **fields}

    def _where(self, item: _Item) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.index, "content_index": 0}

    def first_chunks(self) -> list[dict[str, Any]]:  # items open as the reply reaches them
        return [self._event("response.created", response=self._response(None, [])),
                self._event("response.in_progress", response=self._response(None, []))]

    def _events(self, parts: list[Part]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for kind, value in parts:
            if self._open is None or self._open.kind != _KINDS[kind] or kind == "tool_call":
                events += self._close()
                events += self._add(_Item(_KINDS[kind], len(self._items), value if kind == "tool_call" else None))
            item = self._items[-1]
            if kind == "tool_call":  # a call is whole when parsed: its arguments in one delta, then done
                fields = {"item_id": item.id, "output_index": item.index}
                events += [self._event("response.function_call_arguments.delta", **fields, delta=value.arguments),
                           self._event("response.function_call_arguments.done", **fields, name=value.name,
                                       arguments=value.arguments),
                           self._event("response.output_item.done", output_index=item.index, item=item.body(True))]
                continue
            item.text += value
            delta = "response.output_text.delta" if kind == "content" else "response.reasoning_text.delta"
            events.append(self._event(delta, **self._where(item), delta=value,
                                      **({"logprobs": []} if kind == "content" else {})))
        return events

    def _add(self, item: _Item) -> list[dict[str, Any]]:
        self._items.append(item)
        events = [self._event("response.output_item.added", output_index=item.index, item=item.body(False))]
        if item.kind == "message":
            self._open = item
            events.append(self._event("response.content_part.added", **self._where(item), part=_output_text("")))
        elif item.kind == "reasoning":
            self._open = item
        return events

    def _close(self) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        if item.kind == "reasoning":
            events = [self._event("response.reasoning_text.done", **self._where(item), text=item.text)]
        else:
            events = [self._event("response.output_text.done", **self._where(item), text=item.text, logprobs=[]),
                      self._event("response.content_part.done", **self._where(item), part=_output_text(item.text))]
        return [*events, self._event("response.output_item.done", output_index=item.index, item=item.body(True))]

    def chunks(self, text: str, steps: list[Step]) -> list[dict[str, Any]]:
        return self._events(self._parser.push(text))

    def final_chunks(self, steps: list[Step], gen: Generation, queued_s: float) -> list[dict[str, Any]]:
        events = self._events(self._parser.flush()) + self._close()
        final = self._response(gen, self._items)
        return [*events, self._event(f"response.{final['status']}", response=final)]

    def sse(self, body: dict[str, Any]) -> bytes:
        return named_event(body)

    def sse_error(self, error: APIError) -> bytes:
        return named_event(self._event("error", code=error.code, message=error.message, param=error.param))

    def sse_end(self) -> bytes:
        return b""  # response.completed (or error) was the last event


def _usage(gen: Generation) -> dict[str, Any]:
    return {"input_tokens": gen.prompt_tokens, "input_tokens_details": {"cached_tokens": gen.cached_tokens},
            "output_tokens": len(gen.tokens), "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": gen.prompt_tokens + len(gen.tokens)}
