"""Anthropic's Messages API (POST /v1/messages) mapped onto the chat path: the request becomes a chat request
(system first, tool_use blocks as an assistant turn's tool calls, tool_result blocks as tool turns), the reply
is read as chat replies are (thinking, text, the family's tool calls) and becomes content blocks, streamed as
Anthropic's named events (message_start, content_block_start/delta/stop, message_delta, message_stop)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field

from runner.engine.generation import Generation, Step
from runner.server.errors import APIError, require_named_tool
from runner.server.formats import Format, named_event
from runner.server.reply import Part, ReplySyntax, reply_parts
from runner.server.schemas import (MAX_STOPS, ChatCompletionRequest, ChatMessage, FunctionCall, FunctionDef,
                                   JSONSchemaFormat, NamedFunction, NamedToolChoice, ResponseFormat, StopString,
                                   Tool, ToolCallIn, _Body)
from runner.server.tools import ToolCall


class TextBlock(_Body):
    type: Literal["text"]
    text: str


class ThinkingBlock(_Body):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # accepted; this server signs nothing


class RedactedThinkingBlock(_Body):
    """Thinking Anthropic encrypted: nothing a local model can read, so it is dropped from the turn."""

    type: Literal["redacted_thinking"]
    data: str


class ToolUseBlock(_Body):
    type: Literal["tool_use"]
    id: str
    name: str = Field(min_length=1)
    input: dict[str, Any]


class ToolResultBlock(_Body):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False


Block = Annotated[TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock | ToolResultBlock,
                  Field(discriminator="type")]


class MessageIn(_Body):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolDef(_Body):
    type: str | None = None  # "custom" or absent; Anthropic's server tools (web_search_...) are not served
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None  # a client tool's; server tools have none


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Thinking(_Body):
    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = None  # accepted; the model's own template decides how long it thinks


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
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None

    def to_chat(self) -> ChatCompletionRequest:
        """The same conversation as a chat request (a final assistant message without tool_use stays a prefill)."""
        turns = [ChatMessage(role="system", content=_text(self.system))] if self.system else []
        for i, message in enumerate(self.messages):
            turns += _turns(message, f"messages.{i}")
        if turns[-1].tool_calls:
            raise APIError(400, "the last message calls tools: answer each tool_use with a tool_result in a user "
                                "message", param=f"messages.{len(self.messages) - 1}.content")
        fmt = self.output_config.format if self.output_config else None
        response_format = None if fmt is None else ResponseFormat(
            type="json_schema", json_schema=JSONSchemaFormat(schema=fmt.schema_))
        # enable_thinking is the switch GLM's and Qwen3's templates read; absent, the template's default
        kwargs = {"enable_thinking": self.thinking.type == "enabled"} if self.thinking else None
        choice = self.tool_choice
        return ChatCompletionRequest(messages=turns, max_tokens=self.max_tokens, temperature=self.temperature,
                                     top_p=self.top_p, top_k=self.top_k, stop=self.stop_sequences, stream=self.stream,
                                     response_format=response_format, tools=self._tools(),
                                     tool_choice=_tool_choice(choice, self.tools or []) if choice else None,
                                     parallel_tool_calls=not (choice and choice.disable_parallel_tool_use),
                                     chat_template_kwargs=kwargs)

    def _tools(self) -> list[Tool] | None:
        for i, tool in enumerate(self.tools or []):
            if tool.type not in (None, "custom"):
                raise APIError(400, f"tools.{i}: {tool.type!r} is a server tool; only client tools (name, "
                                    "description, input_schema) are served", param=f"tools.{i}.type")
            if tool.input_schema is None:
                raise APIError(400, f"tools.{i}: a client tool needs an input_schema", param=f"tools.{i}.input_schema")
        return [Tool(type="function", function=FunctionDef(name=t.name, description=t.description,
                                                           parameters=t.input_schema))
                for t in self.tools] if self.tools else None


class CountTokensRequest(MessagesRequest):
    """POST /v1/messages/count_tokens: a Messages request without max_tokens; its prompt is counted, not run."""

    max_tokens: int | None = Field(None, ge=1)  # type: ignore[assignment]


def _tool_choice(choice: ToolChoice, tools: list[ToolDef]) -> Any:
    if choice.type != "tool":
        return {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if not choice.name:
        raise APIError(400, "tool_choice of type tool needs the tool's name", param="tool_choice.name")
    require_named_tool(choice.name, (t.name for t in tools), "tool_choice.name")
    return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))


def _turns(message: MessageIn, where: str) -> list[ChatMessage]:
    """A message as chat turns: an assistant's text, thinking and tool_use blocks are one turn; a user's
    tool_result blocks are tool turns, in order with the user text between them."""
    if isinstance(message.content, str):
        return [ChatMessage(role=message.role, content=message.content)]
    allowed = {"text", "thinking", "redacted_thinking", "tool_use"} if message.role == "assistant" else {
        "text", "tool_result"}
    for j, block in enumerate(message.content):
        if block.type not in allowed:
            raise APIError(400, f"{where}.content.{j}: a {block.type} block does not belong in a {message.role} "
                                "message", param=f"{where}.content.{j}.type")
    if message.role == "assistant":
        calls = [ToolCallIn(id=b.id, function=FunctionCall(name=b.name, arguments=b.input))
                 for b in message.content if isinstance(b, ToolUseBlock)]
        thinking = "".join(b.thinking for b in message.content if isinstance(b, ThinkingBlock))
        return [ChatMessage(role="assistant", content=_text([b for b in message.content if isinstance(b, TextBlock)]),
                            tool_calls=calls or None, reasoning_content=thinking or None)]
    turns: list[ChatMessage] = []
    text: list[TextBlock] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            text.append(block)
            continue
        assert isinstance(block, ToolResultBlock)
        if text:
            turns.append(ChatMessage(role="user", content=_text(text)))
            text = []
        result = _text(block.content)
        # Chat templates have no place for the flag, so the model reads it in the result.
        turns.append(ChatMessage(role="tool", tool_call_id=block.tool_use_id,
                                 content=f"Error: {result}" if block.is_error else result))
    if text or not turns:
        turns.append(ChatMessage(role="user", content=_text(text)))
    return turns


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "".join(block.text for block in content)


def stop_reason(gen: Generation, stops: list[str], decode: Any, called: bool) -> tuple[str | None, str | None]:
    """Anthropic's (stop_reason, stop_sequence): tool_use when the reply ends calling tools, else which stop
    string ended it, if one did."""
    if gen.finish_reason == "length":
        return "max_tokens", None
    if gen.finish_reason != "stop":
        return None, None
    rest = decode(gen.tokens)[len(gen.text):]  # the text cut at the stop string starts with it
    hit = next((s for s in stops if rest.startswith(s)), None)
    if hit is not None:
        return "stop_sequence", hit
    return ("tool_use" if called else "end_turn"), None


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id.replace("call_", "toolu_", 1), "name": call.name,
            "input": json.loads(call.arguments)}


def content_block(kind: str, value: Any) -> dict[str, Any]:
    """A whole content block from a reply part."""
    if kind == "tool_call":
        return _tool_use(value)
    if kind == "reasoning_content":
        return {"type": "thinking", "thinking": value, "signature": ""}
    return {"type": "text", "text": value}


class MessagesFormat(Format):
    prefix, object_name = "msg", "message"

    def __init__(self, *args: Any, stops: list[str], reply: ReplySyntax, **kwargs: Any) -> None:
        super().__init__(*args, return_token_ids=False, logprobs=None, **kwargs)
        self.stops, self.reply = stops, reply
        self.id = self.id.replace("-", "_")
        self._parser = reply.parser()
        self._n_blocks = 0
        self._open: str | None = None  # the type of the block being streamed ("text", "thinking"), if one is

    def _usage(self, gen: Generation | None) -> dict[str, int]:
        cached = gen.cached_tokens if gen is not None else 0
        return {"input_tokens": len(self.prompt_tokens) - cached, "cache_read_input_tokens": cached,
                "cache_creation_input_tokens": 0, "output_tokens": len(gen.tokens) if gen is not None else 0}

    def _message(self, content: list[dict[str, Any]], gen: Generation | None, called: bool) -> dict[str, Any]:
        reason, sequence = (stop_reason(gen, self.stops, self.tokenizer.decode, called) if gen is not None
                            else (None, None))
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": sequence, "usage": self._usage(gen)}

    def response(self, steps: list[Step], gen: Generation, queued_s: float) -> dict[str, Any]:
        parts, calls = reply_parts(self.reply, gen.text)
        return self._message([content_block(kind, value) for kind, value in parts], gen, bool(calls))

    def first_chunks(self) -> list[dict[str, Any]]:  # blocks open as the reply reaches them
        return [{"type": "message_start", "message": self._message([], None, False)}]

    def _events(self, parts: list[Part]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for kind, value in parts:
            if kind == "tool_call":  # a call is whole when parsed: its block opens, carries its input, and stops
                events += self._close()
                block = _tool_use(value)
                events += [self._start({**block, "input": {}}),
                           self._delta({"type": "input_json_delta", "partial_json": value.arguments}),
                           *self._close()]
                continue
            block_type = "thinking" if kind == "reasoning_content" else "text"
            if self._open != block_type:
                events += self._close()
                events.append(self._start(content_block(kind, "")))
            delta_kind = "thinking" if block_type == "thinking" else "text"
            events.append(self._delta({"type": f"{delta_kind}_delta", delta_kind: value}))
        return events

    def _start(self, block: dict[str, Any]) -> dict[str, Any]:
        self._n_blocks += 1
        self._open = block["type"]
        return {"type": "content_block_start", "index": self._n_blocks - 1, "content_block": block}

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self._n_blocks - 1, "delta": delta}

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": self._n_blocks - 1}]

    def chunks(self, text: str, steps: list[Step]) -> list[dict[str, Any]]:
        return self._events(self._parser.push(text))

    def final_chunks(self, steps: list[Step], gen: Generation, queued_s: float) -> list[dict[str, Any]]:
        events = self._events(self._parser.flush()) + self._close()
        reason, sequence = stop_reason(gen, self.stops, self.tokenizer.decode, bool(self._parser.calls))
        return [*events,
                {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                 "usage": {"output_tokens": len(gen.tokens)}},
                {"type": "message_stop"}]

    def sse(self, body: dict[str, Any]) -> bytes:
        return named_event(body)

    def sse_error(self, error: APIError) -> bytes:
        return named_event(error.anthropic_body())

    def sse_end(self) -> bytes:
        return b""  # message_stop (or error) was the last event
