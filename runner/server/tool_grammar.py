"""tool_choice "required" or a named function: a grammar (llguidance's Lark) whose sentences are tool calls
in the syntax the model's template teaches (tools.py reads them back), arguments held to each tool's
JSON schema. The reply starts with the call: a forced call leaves no room for thinking first."""

from __future__ import annotations

import json
from typing import Any

from runner.server.tools import END_TAG, START_TAG, Syntax

# Compact JSON inside calls, as the schema constraint writes it: free whitespace lets a model loop.
_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_ANY_OBJECT: dict[str, Any] = {"type": "object"}
# GLM and the XML form write a string argument bare, ended by the next tag.
_BARE_TEXT = "/[^<]*/"


def tool_call_grammar(syntax: Syntax, tools: list[dict[str, Any]], parallel: bool) -> str:
    """Calls to any of `tools` (OpenAI function tools as dicts): one, or one or more when `parallel`."""
    rules: list[str] = []
    calls = [_call(syntax, tool["function"], f"call_{i}", rules) for i, tool in enumerate(tools)]
    rules.append("call: " + " | ".join(calls))
    separator = "\n" if syntax == "qwen3" else ""  # the Hermes form puts calls on their own lines
    more = f" ({_lit(separator)} call)*" if separator else " call*"
    return "\n".join([f"start: call{more if parallel else ''}", *rules])


def _call(syntax: Syntax, function: dict[str, Any], rule: str, rules: list[str]) -> str:
    name = function["name"]
    schema = function.get("parameters") or _ANY_OBJECT
    if syntax == "qwen3":
        if "properties" in schema:  # as llama.cpp's tool grammars: no parameter the tool does not declare
            schema = {"additionalProperties": False, **schema}
        rules.append(f"{rule}_args: %json {json.dumps(_laid_out(schema), ensure_ascii=False)}")
        head = START_TAG + '\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '
        rules.append(f"{rule}: {_lit(head)} {rule}_args {_lit('}' + chr(10) + END_TAG)}")
        return rule
    args = []
    required = set(schema.get("required") or [])
    for j, (key, prop) in enumerate((schema.get("properties") or {}).items()):
        value = _value(prop if isinstance(prop, dict) else {}, f"{rule}_{j}", rules)
        if syntax == "glm":
            arg = f"{_lit(f'<arg_key>{key}</arg_key>' + chr(10) + '<arg_value>')} {value} {_lit('</arg_value>' + chr(10))}"
        else:
            arg = f"{_lit(f'<parameter={key}>' + chr(10))} {value} {_lit(chr(10) + '</parameter>' + chr(10))}"
        args.append(arg if key in required else f"({arg})?")
    if syntax == "glm":
        head, tail = f"{START_TAG}{name}\n", END_TAG
    else:
        head, tail = f"{START_TAG}\n<function={name}>\n", f"</function>\n{END_TAG}"
    rules.append(f"{rule}: {' '.join([_lit(head), *args, _lit(tail)])}")
    return rule


def _value(prop: dict[str, Any], rule: str, rules: list[str]) -> str:
    """A bare string argument, or JSON under the parameter's own schema."""
    if prop.get("type") == "string":  # bare, so an enum is its words; a pattern is not held to
        return "(" + " | ".join(_lit(str(v)) for v in prop["enum"]) + ")" if prop.get("enum") else _BARE_TEXT
    rules.append(f"{rule}: %json {json.dumps(_laid_out(prop), ensure_ascii=False)}")
    return rule


def _laid_out(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "x-guidance": {**_LAYOUT, **(schema.get("x-guidance") or {})}}


def _lit(text: str) -> str:
    """A Lark string literal (JSON's escapes)."""
    return json.dumps(text, ensure_ascii=False)
