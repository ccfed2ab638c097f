"""The server's chat prompts, rendered from real templates, are what llama.cpp renders.

Two oracles from llama-cpp-python 0.3.36: llama.cpp's C `llama_chat_apply_template` (its built-in
formats, chosen by substrings of the template: no jinja), and llama-cpp-python's Jinja2ChatFormatter
(what its server renders a GGUF's own template with). The C one is held byte for byte wherever it knows
the template's format; each template where it does not carries the one difference, verified in
llama.cpp's src/llama-chat.cpp, as a rewrite of our prompt into llama.cpp's, and everything else must
still match. Requests the C one cannot express (tools, tool calls, template variables) go to the Jinja
one.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from runner.engine.tokenizer import Tokenizer
from runner.server.plan import chat_prompt
from runner.server.schemas import ChatCompletionRequest
from runner.synth.vocab import ARCHS, build_vocab, write_vocab_only

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class BuiltinDiff:
    """Where llama.cpp's built-in format is not the template's: why (as read in src/llama-chat.cpp)."""

    reason: str
    to_builtin: Callable[[str], str]  # our prompt rewritten into llama.cpp's; nothing else may differ


@dataclass(frozen=True)
class Template:
    arch: str  # the family whose (synthetic) vocabulary supplies bos_token and eos_token
    source: str
    builtin_differs: BuiltinDiff | None = None  # None: llama.cpp's built-in format must match exactly


GLM_BUILTIN = BuiltinDiff(
    reason=("'[gMASK]<sop>' selects LLM_CHAT_TEMPLATE_CHATGLM_4, GLM-4-9B's format: '<|assistant|>\\n' before "
            "each reply and as the generation prompt, where GLM-4.5/4.6 writes '<|assistant|>', and "
            "'\\n<think></think>\\n' before a past reply's text"),
    to_builtin=lambda ours: re.sub(r"<\|assistant\|>(\n<think></think>\n?)?", "<|assistant|>\n", ours))
QWEN35_BUILTIN = BuiltinDiff(
    reason=("'<|im_start|>' selects LLM_CHAT_TEMPLATE_CHATML, whose generation prompt is the bare "
            "'<|im_start|>assistant\\n'; Qwen3.5's opens thinking after it with '<think>\\n'"),
    to_builtin=lambda ours: ours.replace("<|im_start|>assistant\n<think>\n", "<|im_start|>assistant\n"))

REAL = {
    "glm-4.6": Template("glm4moe", (TEMPLATES / "glm-4.6.jinja").read_text(), GLM_BUILTIN),
    "qwen3": Template("qwen3moe", (TEMPLATES / "qwen3.jinja").read_text()),
    "qwen3-coder": Template("qwen3moe", (TEMPLATES / "qwen3-coder.jinja").read_text()),
    "qwen3.5": Template("qwen35moe", (TEMPLATES / "qwen3.5.jinja").read_text(), QWEN35_BUILTIN),
}
# The templates our synthesized models carry, one per supported architecture (GLM-4.5's shape, ChatML).
SYNTH = {f"synth-{arch}": Template(arch, build_vocab(arch, 300).chat_template) for arch in sorted(ARCHS)}
ALL = {**REAL, **SYNTH}

TRICKY = "Say \"hi\" — naïve café, 日本語 🙂, it's <b>&amp; \\n {{ x }} {% raw %}"
# Plain conversations: roles and text only, what llama_chat_message (role, content) can carry.
PLAIN = {
    "system-user": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is a meander?"}],
    "multi-turn": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is a meander?"},
                   {"role": "assistant", "content": "A loop in a river."}, {"role": "user", "content": "And an oxbow?"}],
    "unicode-quotes": [{"role": "user", "content": TRICKY}, {"role": "assistant", "content": f"'{TRICKY}'"},
                       {"role": "user", "content": "again"}],
    "prefill": [{"role": "user", "content": "Count to 3"}, {"role": "assistant", "content": "1, 2,"}],
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city — «today»",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "e.g. \"Zürich\""}},
                   "required": ["city"]}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}
# Requests llama_chat_apply_template cannot express: llama_chat_message is role and content only, and
# llm_chat_apply_template takes no tools and no template variables (llama.h, src/llama-chat.cpp).
RICH = {
    "thinking-off": {"messages": PLAIN["system-user"], "chat_template_kwargs": {"enable_thinking": False}},
    "thinking-on": {"messages": PLAIN["system-user"], "chat_template_kwargs": {"enable_thinking": True}},
    "tools": {"messages": PLAIN["system-user"], "tools": [WEATHER]},
    "tool-round": {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 3, \"sky\": \"«grey»\"}"}]},
    "reasoning-history": {"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHello."},
        {"role": "user", "content": "  Padded, with a trailing newline \n"},
        {"role": "assistant", "content": "Sure.", "reasoning_content": "Answer briefly."},
        {"role": "user", "content": "Go on."}]},
}


@pytest.fixture(scope="module")
def vocab_paths(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vocab")
    return {arch: write_vocab_only(folder / f"{arch}.gguf", arch, build_vocab(arch, 300)) for arch in ARCHS}


def ours(vocab_paths: dict[str, Path], template: Template, body: dict[str, Any]) -> str:
    """The prompt text our server renders for the request `body`."""
    with Tokenizer(vocab_paths[template.arch], template.source) as tok:
        return chat_prompt(tok, ChatCompletionRequest(**body)).text


def split_prefill(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """llama-server's prefill, which the oracles lack: the turns before it with the generation prompt, then its text."""
    if messages[-1]["role"] == "assistant":
        return messages[:-1], messages[-1]["content"]
    return messages, ""


def llama_builtin(template: str, messages: list[dict[str, Any]]) -> str | None:
    """llama.cpp's llama_chat_apply_template (add_ass), or None where it does not recognise the template."""
    turns, prefill = split_prefill(messages)
    chat = (llama_cpp.llama_chat_message * len(turns))(
        *[llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in turns])
    size = llama_cpp.llama_chat_apply_template(template.encode(), chat, len(turns), True, None, 0)
    if size < 0:
        return None
    buf = ctypes.create_string_buffer(size + 1)
    assert llama_cpp.llama_chat_apply_template(template.encode(), chat, len(turns), True, buf, size + 1) == size
    return buf.raw[:size].decode() + prefill


def llama_jinja(vocab_paths: dict[str, Path], template: Template, body: dict[str, Any]) -> str:
    """llama-cpp-python's Jinja2ChatFormatter, given bos_token and eos_token as its Llama gives them
    (token_get_text, "" for none) and the request's tools and template variables."""
    with Tokenizer(vocab_paths[template.arch], template.source) as tok:
        bos = "" if tok.bos_id is None else tok.token_text(tok.bos_id)
        eos = tok.token_text(tok.eos_id)
    turns, prefill = split_prefill(copy.deepcopy(body["messages"]))
    for turn in turns:  # arguments as objects: llama-server parses them before rendering, templates iterate them
        for call in turn.get("tool_calls", []):
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    formatter = Jinja2ChatFormatter(template.source, eos_token=eos, bos_token=bos)
    return formatter(messages=turns, tools=body.get("tools"), **body.get("chat_template_kwargs", {})).prompt + prefill


@pytest.mark.parametrize("conversation", PLAIN)
@pytest.mark.parametrize("name", ALL)
def test_plain_conversations_render_as_llama_cpps_builtin_format(vocab_paths, name, conversation) -> None:
    template, messages = ALL[name], PLAIN[conversation]
    got = ours(vocab_paths, template, {"messages": messages})
    builtin = llama_builtin(template.source, messages)
    assert builtin is not None, f"llama.cpp no longer recognises {name}"
    if template.builtin_differs is None:
        assert got == builtin
    else:
        assert got != builtin, f"llama.cpp now formats {name} as its template does: drop builtin_differs"
        assert template.builtin_differs.to_builtin(got) == builtin, template.builtin_differs.reason


@pytest.mark.parametrize("conversation", PLAIN)
@pytest.mark.parametrize("name", ALL)
def test_plain_conversations_render_as_llama_cpp_pythons_jinja_formatter(vocab_paths, name, conversation) -> None:
    body = {"messages": PLAIN[conversation]}
    assert ours(vocab_paths, ALL[name], body) == llama_jinja(vocab_paths, ALL[name], body)


@pytest.mark.parametrize("request_name", RICH)
@pytest.mark.parametrize("name", REAL)
def test_tools_thinking_and_history_render_as_llama_cpp_pythons_jinja_formatter(vocab_paths, name,
                                                                               request_name) -> None:
    body = RICH[request_name]
    got = ours(vocab_paths, REAL[name], body)
    assert got == llama_jinja(vocab_paths, REAL[name], body)
    if "tools" in body:
        assert "get_weather" in got and "«today»" in got  # tojson keeps non-ASCII, as Hugging Face's does



# The shapes of Reka-Edge's and LFM2.5's templates (llama.cpp's models/templates): the loop controls and
# generation tag Hugging Face's environment has, and so llama-cpp-python's.
LOOP_CONTROLS_AND_GENERATION = """{%- set ns = namespace(last_query_index=-1) -%}
{%- for msg in messages[::-1] -%}
    {%- if msg.role == "user" -%}{%- set ns.last_query_index = messages|length - 1 - loop.index0 -%}{%- break -%}
    {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
    {%- if message.role == "system" -%}{%- continue -%}{%- endif -%}
    {{- "<|im_start|>" + message.role + "\\n" -}}
    {%- if message.role == "assistant" -%}
        {%- generation -%}{{- message.content + "<|im_end|>\\n" -}}{%- endgeneration -%}
    {%- else -%}
        {{- message.content + ("*" if loop.index0 == ns.last_query_index else "") + "<|im_end|>\\n" -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- "<|im_start|>assistant\\n" -}}{%- endif -%}"""


def test_loop_controls_and_the_generation_tag_render_as_llama_cpp_pythons_jinja_formatter(vocab_paths) -> None:
    template = Template("qwen3moe", LOOP_CONTROLS_AND_GENERATION)
    body = {"messages": PLAIN["multi-turn"]}
    got = ours(vocab_paths, template, body)
    assert got == llama_jinja(vocab_paths, template, body)
    assert "Be terse." not in got and "And an oxbow?*" in got and "Hi*" not in got


# Llama 3's shape: the template writes bos_token, and the vocabulary asks for a BOS too.
WRITES_BOS = ("{{- bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_template_that_writes_bos_gives_one_bos_as_llama_cpp_does(tmp_path) -> None:
    spec = dataclasses.replace(build_vocab("qwen3moe", 300), add_bos=True)
    path = write_vocab_only(tmp_path / "adds-bos.gguf", "qwen3moe", spec)
    body = {"messages": PLAIN["system-user"]}
    with Tokenizer(path, WRITES_BOS) as tok:
        prompt = chat_prompt(tok, ChatCompletionRequest(**body))
        # llama-cpp-python tokenizes its formatter's prompt without adding BOS (added_special=True)
        theirs = tok.encode(llama_jinja({"qwen3moe": path}, Template("qwen3moe", WRITES_BOS), body), add_special=False)
        assert tok.add_bos and prompt.tokens == theirs
        assert prompt.tokens.count(tok.bos_id) == 1 and prompt.tokens[0] == tok.bos_id
