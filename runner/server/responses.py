"""OpenAI's Responses API (POST /v1/responses) mapped onto the chat path: the conversation (a stored previous
response's, then `input`, a string or items, item references resolved from the store) after `instructions`
becomes a chat request, function_call items as an assistant turn's tool calls and function_call_output items
as tool turns. The reply's output items: responses_output.py; the store: response_store.py."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter

from runner.server.errors import APIError, require_named_tool
from runner.server.response_store import ResponseStore, with_id
from runner.server.schemas import (ChatCompletionRequest, ChatMessage, FunctionCall, FunctionDef, JSONSchemaFormat,
                                   NamedFunction, NamedToolChoice, ResponseFormat, Tool, ToolCallIn, _Body)


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


class ItemReference(_Body):
    """An item of a stored response, by its id."""

    type: Literal["item_reference"]
    id: str


def _item_type(item: Any) -> Any:
    # A message item may leave out its type.
    return item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)


InputItem = Annotated[Annotated[InputMessage, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                      | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
                      | Annotated[ReasoningItem, Tag("reasoning")] | Annotated[ItemReference, Tag("item_reference")],
                      Discriminator(_item_type, custom_error_type="input_item_type", custom_error_message=(
                          "an input item is a message, function_call, function_call_output, reasoning or "
                          "item_reference"))]
_ITEMS = TypeAdapter(list[InputItem])


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
    previous_response_id: str | None = None  # continue a stored response's conversation
    store: bool | None = None  # None: true, as OpenAI's default
    metadata: dict[str, str] | None = None

    def conversation(self, store: ResponseStore) -> list[dict[str, Any]]:
        """What this request answers, oldest first, as the API's item dicts with ids: the previous response's
        conversation (its instructions are not carried over, as OpenAI's), then the input, each
        item_reference replaced by the stored item."""
        items = store.get(self.previous_response_id, "previous_response_id").conversation() if (
            self.previous_response_id is not None) else []
        given = [InputMessage(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        for i, item in enumerate(given):
            items.append(store.item(item.id, f"input.{i}") if isinstance(item, ItemReference) else with_id(
                _as_dict(item)))
        return items

    def to_chat(self, conversation: list[dict[str, Any]]) -> ChatCompletionRequest:
        """`conversation` (from `conversation()`) as a chat request: instructions as the system turn first."""
        turns = [ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        turns += _turns(_ITEMS.validate_python(conversation))
        if turns[-1].tool_calls:
            raise APIError(400, "the input ends with a function_call: answer it with a function_call_output item",
                           param="input" if isinstance(self.input, str) else f"input.{len(self.input) - 1}")
        choice = self.tool_choice
        if isinstance(choice, FunctionChoice):
            require_named_tool(choice.name, (t.name for t in self.tools or []), "tool_choice.name")
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


def _as_dict(item: InputItem) -> dict[str, Any]:
    """An input item as the API shows it: a message's text as one content part."""
    body = item.model_dump(by_alias=True, exclude_none=True)
    if isinstance(item, InputMessage) and isinstance(item.content, str):
        kind = "output_text" if item.role == "assistant" else "input_text"
        body["content"] = [{"type": kind, "text": item.content}]
    return body


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


def list_page(items: list[dict[str, Any]], limit: int, order: str, after: str | None) -> dict[str, Any]:
    """A page of a stored response's input items as OpenAI lists them: `order` by age, the `limit` after the
    item with id `after`."""
    if not 1 <= limit <= 100:
        raise APIError(400, f"limit must be between 1 and 100, got {limit}", param="limit")
    if order not in ("asc", "desc"):
        raise APIError(400, f"order is 'asc' or 'desc', got {order!r}", param="order")
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise APIError(400, f"after: no input item with id {after!r} in this response", param="after")
        start = ids.index(after) + 1
    page = ordered[start:start + limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(ordered)}
