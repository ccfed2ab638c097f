"""Structured output: the constraint a request asks for (OpenAI's response_format, llama.cpp's json_schema
and grammar fields, a forced tool call) compiled against the served model's vocabulary."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Literal

from runner.engine.grammar import Grammar, GrammarError, GrammarVocab
from runner.server.errors import APIError, require_named_tool
from runner.server.schemas import NamedToolChoice
from runner.server.tool_grammar import tool_call_grammar
from runner.server.tools import template_syntax

# OpenAI's json_object means "some JSON object"; llama-server takes a schema beside it, as json_schema does.
ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class Constraint:
    kind: Literal["json_schema", "gbnf", "lark"]  # lark: a grammar the server writes (forced tool calls)
    source: dict[str, Any] | str
    param: str  # the request field it came from, named by a 400


def requested_constraint(body: Any, template: str | None) -> Constraint | None:
    """The one constraint `body` asks for, if any; two at once (say response_format and grammar) is a 400.
    A forced tool call (tool_choice "required" or a named function) is one, in `template`'s call syntax."""
    found: list[Constraint] = []
    choice = getattr(body, "tool_choice", None)
    if choice == "required" or isinstance(choice, NamedToolChoice):
        found.append(_forced_call(body, choice, template))
    response_format = getattr(body, "response_format", None)
    if response_format is not None and response_format.type != "text":
        found.append(_from_response_format(response_format))
    if body.json_schema is not None:
        found.append(Constraint("json_schema", body.json_schema, "json_schema"))
    if body.grammar is not None:
        found.append(Constraint("gbnf", body.grammar, "grammar"))
    if len(found) > 1:
        raise APIError(400, f"{found[0].param} and {found[1].param} both constrain the output; give one",
                       param=found[1].param)
    return found[0] if found else None


def _forced_call(body: Any, choice: Any, template: str | None) -> Constraint:
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
    if not tools:
        raise APIError(400, "tool_choice forces a tool call, but the request offers no tools", param="tool_choice")
    syntax = template_syntax(template)
    if syntax is None:
        raise APIError(400, "this model's chat template teaches no tool-call syntax this server reads (GLM-4.5's, "
                            "Qwen3's <tool_call> JSON or its XML form)", param="tools")
    if isinstance(choice, NamedToolChoice):
        require_named_tool(choice.function.name, (t["function"]["name"] for t in tools), "tool_choice.function.name")
        tools = [t for t in tools if t["function"]["name"] == choice.function.name]
    parallel = choice == "required" and body.parallel_tool_calls  # a named function is called once
    return Constraint("lark", tool_call_grammar(syntax, tools, parallel), "tool_choice")


def _from_response_format(fmt: Any) -> Constraint:
    if fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise APIError(400, "response_format of type json_schema needs a json_schema object",
                           param="response_format.json_schema")
        schema = fmt.json_schema.schema_
        return Constraint("json_schema", ANY_OBJECT if schema is None else schema, "response_format.json_schema.schema")
    return Constraint("json_schema", ANY_OBJECT if fmt.schema_ is None else fmt.schema_, "response_format")


class Grammars:
    """Compiles constraints for one server; the vocabulary's view is built on the first one (a pass over
    every token) and kept. Thread-safe: requests compile in worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._vocab: GrammarVocab | None = None
        self._tokenizer: Any = None

    def compile(self, tokenizer: Any, constraint: Constraint | None) -> Grammar | None:
        """The checked grammar for `constraint` (None: unconstrained); a bad one is a one-line 400."""
        if constraint is None:
            return None
        vocab = self._vocab_for(tokenizer)
        try:
            if constraint.kind == "gbnf":
                return vocab.gbnf(str(constraint.source))
            if constraint.kind == "lark":
                return vocab.lark(str(constraint.source))
            return vocab.json_schema(constraint.source)  # type: ignore[arg-type]
        except GrammarError as exc:
            raise APIError(400, f"{constraint.param}: {exc}", param=constraint.param) from None

    def _vocab_for(self, tokenizer: Any) -> GrammarVocab:
        with self._lock:
            if self._vocab is None or self._tokenizer is not tokenizer:
                self._vocab, self._tokenizer = GrammarVocab(tokenizer), tokenizer
            return self._vocab
