"""Request bodies of the OpenAI endpoints (plus llama.cpp / vLLM extensions) and of /tokenize; /health's answer."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Stop strings are matched against the text after every token, so their number and length are capped
# (OpenAI takes 4; more or longer is a 400).
MAX_STOPS = 16
MAX_STOP_CHARS = 256
StopString = Annotated[str, Field(max_length=MAX_STOP_CHARS)]
# Several prompts in one /v1/completions request run one after another on the single sequence.
MAX_PROMPTS = 16
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class _Body(BaseModel):
    # strict: "0.5" is not a number and 1.0 not an int, as with OpenAI; unknown fields are ignored
    # the way llama.cpp and vLLM ignore them, except the ones `unsupported()` refuses.
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class TextPart(_Body):
    type: Literal["text"]
    text: str


class FunctionCall(_Body):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = Field("{}", description="a JSON object, as a string (OpenAI) or as is")


class ToolCallIn(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(_Body):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(_Body):
    """A turn. The model's own chat template decides how it is written, and may refuse a role or an
    order of turns (a 400 that quotes it)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = Field(None, description="an assistant turn's calls")
    tool_call_id: str | None = Field(None, description="a tool turn: the call it answers")
    reasoning_content: str | None = Field(None, description="an assistant turn's thinking, for templates that "
                                                            "show it in the history")

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class JSONSchemaFormat(_Body):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="absent: any JSON object")
    strict: bool | None = Field(None, description="accepted; the output always follows the schema")


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="extension (llama-server's): the "
                                                                              "schema of a json_object")


class _Generation(_Body):
    """Fields both endpoints share; absent sampling fields take the engine's (llama.cpp's) defaults."""

    model: str | None = None  # optional and not checked, as in llama.cpp's server: one model is served
    max_tokens: int | None = Field(None, ge=0)
    n_predict: int | None = Field(None, ge=-1, description="extension (llama.cpp's max_tokens): -1 or absent "
                                                              "generates until the context ends")
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, description="extension: <= 0 keeps every token")
    min_p: float | None = Field(None, ge=0, le=1, description="extension")
    seed: int | None = Field(None, description="-1 (llama.cpp's) or absent: a random seed")
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOPS)] | None = Field(
        None, description=f"at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters")
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repeat_penalty: float | None = Field(None, gt=0, le=10, description="extension (llama.cpp's): positive logits "
                                         "of tokens generated so far divided by it, negative ones multiplied; 1: off")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1)
    logit_bias: dict[str, float] | None = Field(None, description="token id -> bias in [-100, 100] added to its "
                                                          "logit before sampling (OpenAI's)")
    return_token_ids: bool = Field(False, description="extension: token ids per choice and chunk, and prompt_token_ids")
    ignore_eos: bool = Field(False, description="extension: keep generating past end-of-generation tokens")
    cache_prompt: bool = Field(True, description="extension (llama.cpp's): false reuses no cached KV prefix, so the "
                                                 "whole prompt is prefilled (cold measurements)")
    json_schema: dict[str, Any] | None = Field(None, description="extension (llama.cpp's): the output is JSON "
                                                                 "valid under this schema")
    grammar: str | None = Field(None, description="extension (llama.cpp's): the output follows this GBNF grammar")

    def token_limit(self) -> int | None:
        """The tokens asked for (max_tokens, else llama.cpp's n_predict); None: until the context ends."""
        if self.max_tokens is not None:
            return self.max_tokens
        return None if self.n_predict in (None, -1) else self.n_predict

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def unsupported(self) -> tuple[str, str] | None:
        """(param, message) for a setting this server would otherwise silently get wrong."""
        if self.n not in (None, 1):
            return "n", "only n = 1 is supported"
        return None


class ChatCompletionRequest(_Generation):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="extension (llama-server's): more "
                                                        "variables for the chat template, e.g. enable_thinking")
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = Field(
        None, description="passed to the chat template as reasoning_effort (templates that read it)")
    reasoning_format: Literal["auto", "deepseek", "none"] = Field(
        "auto", description="extension (llama-server's): deepseek puts <think>...</think> in reasoning_content; "
                            "auto does so when the chat template writes <think>; none leaves it in content")

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else super().token_limit()

    def unsupported(self) -> tuple[str, str] | None:
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs: true"
        return super().unsupported()


class CompletionRequest(_Generation):
    prompt: (Annotated[str, Field(min_length=1)] | TokenIds
             | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_PROMPTS)]
             | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]) = Field(
        description=f"a text, token ids, or a list of up to {MAX_PROMPTS} of either (one choice each, in order)")
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    def unsupported(self) -> tuple[str, str] | None:
        if self.echo:
            return "echo", "echo is not supported"
        if self.suffix:
            return "suffix", "suffix (insertion) is not supported"
        if self.best_of not in (None, 1):
            return "best_of", "only best_of = 1 is supported"
        return super().unsupported()


class TokenizeRequest(_Body):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int]


class HealthBody(BaseModel):
    status: Literal["ok", "loading", "unhealthy"]
    reason: str | None = Field(None, description="why the server is not ok (503)")
