"""Anthropic's Messages API (POST /v1/messages), text only, mapped onto the chat path: the request becomes
a chat request (system first), the reply becomes a message with one text block, streamed as Anthropic's
named events (message_start, content_block_start/delta/stop, message_delta, message_stop)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from runner.engine.generation import Generation, Step
from runner.server.errors import APIError
from runner.server.formats import Format, named_event
from runner.server.schemas import (MAX_STOPS, ChatCompletionRequest, ChatMessage, JSONSchemaFormat, ResponseFormat,
                                   StopString, _Body)


class TextBlock(_Body):
    type: Literal["text"]
    text: str


class MessageIn(_Body):
    role: Literal["user", "assistant"]
    content: str | list[TextBlock]


class Thinking(_Body):
    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = None


class JSONOutputFormat(_Body):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Body):
    format: JSONOutputFormat | None = None  # structured output: the reply is JSON valid under the schema
    effort: str | None = None  # accepted; the model's own template decides how long it thinks


class MessagesRequest(_Body):
    model: str | None = None  # any name reaches the one model served
    max_tokens: int = Field(ge=1)
    messages: list[MessageIn] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: Annotated[list[StopString], Field(max_length=MAX_STOPS)] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None

    def to_chat(self) -> ChatCompletionRequest:
        """The same conversation as a chat request (a final assistant message stays a prefill)."""
        if self.tools:
            raise APIError(400, "tools are not supported on /v1/messages (use /v1/chat/completions)", param="tools")
        if self.thinking is not None and self.thinking.type == "enabled":
            raise APIError(400, "extended thinking is not supported on /v1/messages", param="thinking")
        turns = [ChatMessage(role="system", content=_text(self.system))] if self.system else []
        turns += [ChatMessage(role=m.role, content=_text(m.content)) for m in self.messages]
        fmt = self.output_config.format if self.output_config else None
        response_format = None if fmt is None else ResponseFormat(
            type="json_schema", json_schema=JSONSchemaFormat(schema=fmt.schema_))
        return ChatCompletionRequest(messages=turns, max_tokens=self.max_tokens, temperature=self.temperature,
                                     top_p=self.top_p, top_k=self.top_k, stop=self.stop_sequences, stream=self.stream,
                                     response_format=response_format)


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "".join(block.text for block in content)


def stop_reason(gen: Generation, stops: list[str], decode: Any) -> tuple[str | None, str | None]:
    """Anthropic's (stop_reason, stop_sequence): which stop string ended the reply, if one did."""
    if gen.finish_reason == "length":
        return "max_tokens", None
    if gen.finish_reason != "stop":
        return None, None
    rest = decode(gen.tokens)[len(gen.text):]  # the text cut at the stop string starts with it
    hit = next((s for s in stops if rest.startswith(s)), None)
    return ("stop_sequence", hit) if hit is not None else ("end_turn", None)


class MessagesFormat(Format):
    prefix, object_name = "msg", "message"

    def __init__(self, *args: Any, stops: list[str], **kwargs: Any) -> None:
        super().__init__(*args, return_token_ids=False, logprobs=None, **kwargs)
        self.stops = stops
        self.id = self.id.replace("-", "_")

    def _usage(self, gen: Generation | None) -> dict[str, int]:
        cached = gen.cached_tokens if gen is not None else 0
        return {"input_tokens": len(self.prompt_tokens) - cached, "cache_read_input_tokens": cached,
                "cache_creation_input_tokens": 0, "output_tokens": len(gen.tokens) if gen is not None else 0}

    def _message(self, content: list[dict[str, Any]], gen: Generation | None) -> dict[str, Any]:
        reason, sequence = stop_reason(gen, self.stops, self.tokenizer.decode) if gen is not None else (None, None)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": sequence, "usage": self._usage(gen)}

    def response(self, steps: list[Step], gen: Generation, queued_s: float) -> dict[str, Any]:
        return self._message([{"type": "text", "text": gen.text}], gen)

    def first_chunks(self) -> list[dict[str, Any]]:  # the one text block opens with the message
        return [{"type": "message_start", "message": self._message([], None)},
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]

    def chunks(self, text: str, steps: list[Step]) -> list[dict[str, Any]]:
        return [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}]

    def final_chunks(self, steps: list[Step], gen: Generation, queued_s: float) -> list[dict[str, Any]]:
        reason, sequence = stop_reason(gen, self.stops, self.tokenizer.decode)
        return [{"type": "content_block_stop", "index": 0},
                {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                 "usage": {"output_tokens": len(gen.tokens)}},
                {"type": "message_stop"}]

    def sse(self, body: dict[str, Any]) -> bytes:
        return named_event(body)

    def sse_error(self, error: APIError) -> bytes:
        return named_event({"type": "error", "error": {"type": error.body()["error"]["type"], "message": error.message}})

    def sse_end(self) -> bytes:
        return b""  # message_stop (or error) was the last event


