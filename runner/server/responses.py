"""OpenAI's Responses API (POST /v1/responses), text only and stateless, mapped onto the chat path: `input`
(a string or messages) after `instructions` becomes a chat request; the reply is one output message with
one output_text part, streamed as the API's named events (response.created ... response.completed)."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field

from runner.engine.generation import Generation, Step
from runner.server.errors import APIError
from runner.server.formats import Format, named_event
from runner.server.schemas import ChatCompletionRequest, ChatMessage, JSONSchemaFormat, ResponseFormat, _Body


class InputText(_Body):
    type: Literal["input_text", "output_text"]  # a replayed assistant turn carries output_text
    text: str


class InputMessage(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]


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
    input: str | list[InputMessage] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    text: TextOptions | None = None
    reasoning: Reasoning | None = None
    tools: list[dict[str, Any]] | None = None
    previous_response_id: str | None = None
    store: bool | None = None  # accepted; nothing is stored
    metadata: dict[str, str] | None = None

    def to_chat(self) -> ChatCompletionRequest:
        """The same conversation as a chat request: instructions as the system turn, then the input."""
        if self.tools:
            raise APIError(400, "tools are not supported on /v1/responses (use /v1/chat/completions)", param="tools")
        if self.previous_response_id is not None:
            raise APIError(400, "responses are not stored: send the whole conversation as input",
                           param="previous_response_id")
        turns = [ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        if isinstance(self.input, str):
            turns.append(ChatMessage(role="user", content=self.input))
        else:
            turns += [ChatMessage(role=m.role, content=m.content if isinstance(m.content, str)
                                  else "".join(p.text for p in m.content)) for m in self.input]
        return ChatCompletionRequest(messages=turns, max_tokens=self.max_output_tokens, temperature=self.temperature,
                                     top_p=self.top_p, stream=self.stream, response_format=self._response_format(),
                                     reasoning_effort=self.reasoning.effort if self.reasoning else None)

    def _response_format(self) -> ResponseFormat | None:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type != "json_schema":
            return ResponseFormat(type=fmt.type) if fmt is not None else None
        schema = JSONSchemaFormat(name=fmt.name, schema=fmt.schema_, strict=fmt.strict)
        return ResponseFormat(type="json_schema", json_schema=schema)


class ResponsesFormat(Format):
    prefix, object_name = "resp", "response"

    def __init__(self, *args: Any, request: ResponsesRequest, **kwargs: Any) -> None:
        super().__init__(*args, return_token_ids=False, logprobs=None, **kwargs)
        self.request = request
        self.item_id = self.id.replace("resp-", "msg_")
        self.id = self.id.replace("-", "_")
        self._text = ""
        self._sequence = 0

    def _item(self, text: str | None) -> dict[str, Any]:
        content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
        return {"type": "message", "id": self.item_id, "status": "in_progress" if text is None else "completed",
                "role": "assistant", "content": content}

    def _response(self, gen: Generation | None) -> dict[str, Any]:
        r = self.request
        status, incomplete = "in_progress", None
        if gen is not None:
            status = "incomplete" if gen.finish_reason == "length" else "completed"
            incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        text_format = r.text.format.model_dump(by_alias=True, exclude_none=True) if r.text and r.text.format else {
            "type": "text"}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": [self._item(gen.text)] if gen is not None else [],
                "incomplete_details": incomplete, "error": None, "instructions": r.instructions,
                "max_output_tokens": r.max_output_tokens, "temperature": r.temperature, "top_p": r.top_p,
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "text": {"format": text_format},
                "metadata": r.metadata or {}, "usage": _usage(gen) if gen is not None else None,
                "completed_at": int(time.time()) if status == "completed" else None}

    def response(self, steps: list[Step], gen: Generation, queued_s: float) -> dict[str, Any]:
        return self._response(gen)

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self._sequence += 1
        return {"type": kind, "sequence_number": self._sequence - 1, **fields}

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "output_index": 0, "content_index": 0}

    def first_chunks(self) -> list[dict[str, Any]]:
        empty_part = {"type": "output_text", "text": "", "annotations": []}
        return [self._event("response.created", response=self._response(None)),
                self._event("response.in_progress", response=self._response(None)),
                self._event("response.output_item.added", output_index=0, item=self._item(None)),
                self._event("response.content_part.added", **self._where(), part=empty_part)]

    def chunks(self, text: str, steps: list[Step]) -> list[dict[str, Any]]:
        self._text += text
        return [self._event("response.output_text.delta", **self._where(), delta=text, logprobs=[])]

    def final_chunks(self, steps: list[Step], gen: Generation, queued_s: float) -> list[dict[str, Any]]:
        part = {"type": "output_text", "text": gen.text, "annotations": []}
        final = self._response(gen)
        return [self._event("response.output_text.done", **self._where(), text=gen.text, logprobs=[]),
                self._event("response.content_part.done", **self._where(), part=part),
                self._event("response.output_item.done", output_index=0, item=self._item(gen.text)),
                self._event(f"response.{final['status']}", response=final)]

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
