"""From a validated request body to the prompt tokens and settings the engine runs."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from runner.engine.generation import fit_to_context
from runner.engine.grammar import Grammar
from runner.engine.sampling import SamplingParams
from runner.errors import GenerationError
from runner.server.errors import APIError
from runner.server.reasoning import prompt_opens_thinking, template_thinks
from runner.server.reply import ReplySyntax
from runner.server.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, _Generation
from runner.server.structured import requested_constraint
from runner.server.tools import Syntax, param_types, template_syntax
from runner.server.worker import GenerationSpec

# The engine samples from softmax(logits / T); below this, logits / T overflows float64 and the
# distribution turns into NaNs, and such a temperature means greedy anyway.
_MIN_TEMPERATURE = 1e-30


# What the server itself gives the template; chat_template_kwargs may add to it, not replace it.
_TEMPLATE_OWN = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ChatPrompt:
    tokens: list[int]
    text: str  # as rendered, before tokenizing
    continues: bool  # the last message was the assistant's: the reply continues it (prefill)


def chat_prompt(tokenizer: Any, body: ChatCompletionRequest) -> ChatPrompt:
    """The model's own chat template, then its special tokens parsed (BOS added if the model wants it).

    A final assistant message is a prefill, as in llama-server: the turns before it are rendered with
    the generation prompt and its text appended, so the reply continues it instead of opening a turn.
    """
    turns = [_turn(m, f"messages.{i}") for i, m in enumerate(body.messages)]
    continues = turns[-1]["role"] == "assistant"
    if continues and len(turns) > 1 and turns[-2]["role"] == "assistant":
        raise APIError(400, "a prefill is one assistant message at the end, not two", param="messages")
    context = _template_context(body)
    if continues:
        text = tokenizer.render_chat(turns[:-1], add_generation_prompt=True, **context) + turns[-1]["content"]
    else:
        text = tokenizer.render_chat(turns, add_generation_prompt=True, **context)
    return ChatPrompt(_encode(tokenizer, text, "messages"), text, continues)


def reply_syntax(body: ChatCompletionRequest, template: str | None, prompt: ChatPrompt) -> ReplySyntax:
    """How to read the reply: its thinking, and the tool calls the request offers."""
    tools = tool_syntax(body, template)
    return ReplySyntax(_reasoning_split(body, template, prompt), tools,
                       param_types([t.model_dump() for t in body.tools or []]) if tools else None,
                       body.parallel_tool_calls)


def _reasoning_split(body: ChatCompletionRequest, template: str | None, prompt: ChatPrompt) -> bool | None:
    """None: the reply is all content; else split off its thinking (True: it starts inside <think>)."""
    if prompt.continues or body.reasoning_format == "none":
        return None  # a prefill is the client's text to continue, as llama-server leaves it
    if requested_constraint(body, template) is not None:
        return None  # the grammar holds from the first token: the reply is what it allows, all content
    if body.reasoning_format == "auto" and not template_thinks(template):
        return None
    return prompt_opens_thinking(prompt.text)


def tool_syntax(body: ChatCompletionRequest, template: str | None) -> Syntax | None:
    """The syntax of the tool calls to look for in the reply; None when the request offers no tools."""
    if not body.tools or body.tool_choice == "none":
        return None
    syntax = template_syntax(template)
    if syntax is None:
        raise APIError(400, "this model's chat template teaches no tool-call syntax this server reads (GLM-4.5's, "
                            "Qwen3's <tool_call> JSON or its XML form)", param="tools")
    return syntax


def _turn(message: ChatMessage, where: str) -> dict[str, Any]:
    # "developer" is OpenAI's newer name for the system role; model templates know "system".
    turn: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role,
                            "content": message.text()}
    for name in ("name", "reasoning_content", "tool_call_id"):
        if getattr(message, name) is not None:
            turn[name] = getattr(message, name)
    if message.tool_calls:  # templates iterate the arguments, so they go in as objects (as llama.cpp does)
        turn["tool_calls"] = [{"id": c.id, "type": c.type, "function": {
            "name": c.function.name, "arguments": _arguments(c.function.arguments, f"{where}.tool_calls.{i}")}}
            for i, c in enumerate(message.tool_calls)]
    return turn


def _arguments(arguments: str | dict[str, Any], where: str) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        raise APIError(400, f"{where}.function.arguments is not valid JSON: {exc}",
                       param=f"{where}.function.arguments") from None
    if not isinstance(parsed, dict):
        raise APIError(400, f"{where}.function.arguments must be a JSON object", param=f"{where}.function.arguments")
    return parsed


def _template_context(body: ChatCompletionRequest) -> dict[str, Any]:
    context = dict(body.chat_template_kwargs or {})
    for name in context:
        if not _NAME.fullmatch(name) or name in _TEMPLATE_OWN:
            raise APIError(400, f"chat_template_kwargs: {name!r} is not a template variable a request may set",
                           param="chat_template_kwargs")
    if body.reasoning_effort is not None:
        context.setdefault("reasoning_effort", body.reasoning_effort)
    if body.tools and body.tool_choice != "none":
        context["tools"] = [t.model_dump(exclude_none=True) for t in body.tools]
    return context


def completion_prompts(tokenizer: Any, body: CompletionRequest) -> list[list[int]]:
    """Each prompt's tokens: a text is encoded, token ids are taken as given (the engine checks their range)."""
    prompt = body.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]  # type: ignore[list-item]
    if not prompt:
        raise APIError(400, "the prompt is empty", param="prompt")
    return [_encode(tokenizer, p, "prompt") if isinstance(p, str) else list(p) for p in prompt]  # type: ignore[arg-type]


def _encode(tokenizer: Any, text: str, param: str) -> list[int]:
    try:
        tokens = tokenizer.encode(text, add_special=True, parse_special=True)
    except UnicodeEncodeError:
        raise APIError(400, f"{param} is not valid Unicode (a lone surrogate?)", param=param) from None
    if not tokens:
        raise APIError(400, "the prompt is empty", param=param)
    return tokens


def generation_spec(body: _Generation, prompt_tokens: list[int], n_ctx: int, max_tokens: int | None,
                    logprobs: int | None, prompt_param: str, grammar: Grammar | None = None, *,
                    n_vocab: int) -> GenerationSpec:
    """Checks what is cheap to check before queueing: unsupported settings, that the prompt fits the context.
    `grammar` (compiled from the request's response_format, json_schema or grammar) constrains the output."""
    refused = body.unsupported()
    if refused:
        raise APIError(400, refused[1], param=refused[0])
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options needs stream: true", param="stream_options")
    try:  # max_tokens past the room left (or absent) stops at the context end, as llama-server does
        max_tokens = fit_to_context(len(prompt_tokens), max_tokens, n_ctx)
    except GenerationError as exc:
        raise APIError(400, str(exc), param=prompt_param, code="context_length_exceeded") from None
    return GenerationSpec(tuple(prompt_tokens), max_tokens, _sampling(body, grammar, n_vocab), tuple(body.stops()),
                          body.ignore_eos, logprobs, body.cache_prompt)


def _logit_bias(given: dict[str, float] | None, n_vocab: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias (token id strings to a bias in [-100, 100]) as (token, bias) pairs."""
    out = []
    for key, bias in (given or {}).items():
        token = int(key) if key.strip().isdigit() else -1
        if not 0 <= token < n_vocab:
            raise APIError(400, f"logit_bias: {key!r} is not a token id of this vocabulary (0 to {n_vocab - 1})",
                           param="logit_bias")
        if not -100 <= bias <= 100:
            raise APIError(400, f"logit_bias: token {token}'s bias {bias} is outside [-100, 100]", param="logit_bias")
        out.append((token, float(bias)))
    return tuple(out)


def _sampling(body: _Generation, grammar: Grammar | None, n_vocab: int) -> SamplingParams:
    given: dict[str, Any] = {k: v for k, v in (
        ("temperature", body.temperature), ("top_k", body.top_k), ("top_p", body.top_p), ("min_p", body.min_p),
        ("presence_penalty", body.presence_penalty), ("frequency_penalty", body.frequency_penalty),
        ("repeat_penalty", body.repeat_penalty),
    ) if v is not None}
    if given.get("temperature", 1.0) < _MIN_TEMPERATURE:
        given["temperature"] = 0.0
    if body.seed is not None and body.seed != -1:  # -1 is llama.cpp's "random", as an absent seed
        # OpenAI seeds are any integer; numpy's generator wants a non-negative one.
        given["seed"] = body.seed % 2**64
    # raises GenerationError (-> 400) on a value the engine refuses
    return SamplingParams(**given, logit_bias=_logit_bias(body.logit_bias, n_vocab), grammar=grammar)
