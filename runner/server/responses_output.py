"""The reply to a Responses API request as output items (reasoning, message, function_call), read as chat
replies are (thinking, text, the family's tool calls); whole, or streamed as the API's named events
(response.created, output_item.added, output_text / function_call_arguments deltas, ..., response.completed)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable

from runner.engine.generation import Generation, Step
from runner.server.errors import APIError
from runner.server.formats import Format, named_event
from runner.server.reply import Part, ReplySyntax, reply_parts
from runner.server.responses import FunctionChoice, ResponsesRequest
from runner.server.tools import ToolCall


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

    def __init__(self, *args: Any, request: ResponsesRequest, reply: ReplySyntax,
                 on_done: Callable[[dict[str, Any]], None] | None = None, **kwargs: Any) -> None:
        """`on_done(response)` hears each finished response (the store keeps it)."""
        super().__init__(*args, return_token_ids=False, logprobs=None, **kwargs)
        self.request, self.reply, self.on_done = request, reply, on_done
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
                "previous_response_id": r.previous_response_id, "store": r.store is not False,
                "completed_at": int(time.time()) if status == "completed" else None}

    def _done(self, gen: Generation, items: list[_Item]) -> dict[str, Any]:
        response = self._response(gen, items)
        if self.on_done is not None:
            self.on_done(response)
        return response

    def response(self, steps: list[Step], gen: Generation, queued_s: float) -> dict[str, Any]:
        items = []
        for kind, value in reply_parts(self.reply, gen.text)[0]:
            item = _Item(_KINDS[kind], len(items), value if kind == "tool_call" else None)
            item.text = value if isinstance(value, str) else ""
            items.append(item)
        return self._done(gen, items)

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
        final = self._done(gen, self._items)
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
