"""A chat template is code from the model file: it renders in jinja2's sandbox within a time and a size
limit, and a template that loops, blows up or reaches for Python internals is one TokenizerError line."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf_edit import rewrite_gguf
from jinja2.sandbox import ImmutableSandboxedEnvironment

from runner.engine.chat_template import TemplateLimits
from runner.engine.tokenizer import Tokenizer
from runner.errors import TokenizerError
from runner.synth.vocab import build_vocab, write_vocab_only

QUICK = TemplateLimits(time_s=0.3)
GENEROUS_S = 30  # an upper bound for "it stopped", never a measurement

LOOPS_FOREVER = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
LOOPS_OVER_MESSAGES = ("{% for i in range(100000) %}{% for m in messages %}{% for n in messages %}"
                       "{% endfor %}{% endfor %}{% endfor %}")
HUGE_OUTPUT = "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"
HUGE_IN_A_MACRO = ("{% macro m() %}{% for i in range(100000) %}{% for j in range(1000) %}template text{% endfor %}"
                   "{% endfor %}{% endmacro %}{{ m()|length }}")
DOUBLING = "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
ONE_HUGE_VALUE = ["{{ 'a' * 10000000000 }}", "{{ 'a'|center(10000000000) }}", "{{ 'a'.ljust(10000000000) }}",
                  "{{ '{:>10000000000}'.format(1) }}", "{{ '%10000000000d' % 1 }}", "{{ [1]|slice(10000000000)|list }}",
                  "{{ 'ab'.replace('', 'x' * 1000000) }}", "{{ 10 ** 100000 }}"]
UNSAFE = ["{{ ''.__class__.__mro__[1].__subclasses__() }}", "{{ messages.__class__ }}", "{{ messages.append(1) }}",
          "{{ messages[0].update({'role': 'x'}) }}", "{{ raise_exception.__globals__ }}"]

# Exercises what real chat templates use (Qwen3's and GLM-4.5's shapes): namespace, a reversed walk,
# loop variables, macros, `is` tests, string methods, tojson, format.
RICH = """{%- macro text(c) -%}{%- if c is string -%}{{ c }}{%- else -%}{{ c|map(attribute='text')|join('') }}{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages[::-1] -%}{%- if ns.last_user < 0 and m.role == 'user' -%}
{%- set ns.last_user = (messages|length - 1) - loop.index0 -%}{%- endif -%}{%- endfor -%}
{{- bos_token -}}
{%- for m in messages -%}
{%- set content = text(m.content) -%}
{%- if m.role == 'assistant' and '</think>' in content -%}{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
{%- endif -%}
<|{{ m.role }}|>{{ '%02d' % loop.index }}{% if loop.index0 == ns.last_user %}*{% endif %}
{{ content.strip() }}{{ m.get('tool_calls', [])|tojson if m.tool_calls is defined else '' }}
{%- if not loop.last %}{{ '{}'.format('|') }}{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"""

CONVERSATION = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "What is a meander?"},
    {"role": "assistant", "content": "<think>rivers</think>\nA loop in a river.", "tool_calls": [{"name": "f"}]},
    {"role": "user", "content": [{"type": "text", "text": "And an "}, {"type": "text", "text": "oxbow?"}]},
]


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory) -> Path:
    return write_vocab_only(tmp_path_factory.mktemp("vocab") / "t.gguf", "qwen3moe", build_vocab("qwen3moe", 300))


def render(path: Path, template: str, messages=None, limits: TemplateLimits = QUICK) -> str:
    with Tokenizer(path, template, limits) as tok:
        return tok.render_chat(messages or [{"role": "user", "content": "hi"}])


def refused(path: Path, template: str, messages=None) -> str:
    with pytest.raises(TokenizerError) as info:
        render(path, template, messages)
    message = str(info.value)
    assert "\n" not in message and message.startswith("t.gguf: "), message
    return message


@pytest.mark.parametrize("template", [LOOPS_FOREVER, LOOPS_OVER_MESSAGES])
def test_a_template_that_loops_stops_at_its_time_limit(vocab_path, template) -> None:
    many = [{"role": "user", "content": "hi"}] * 200
    start = time.monotonic()
    assert "ran past its time limit (0.3 s)" in refused(vocab_path, template, many)
    assert time.monotonic() - start < GENEROUS_S


@pytest.mark.parametrize("template", [HUGE_OUTPUT, HUGE_IN_A_MACRO, DOUBLING, *ONE_HUGE_VALUE])
def test_a_template_that_builds_too_much_stops_at_its_size_limit(vocab_path, template) -> None:
    message = refused(vocab_path, template)
    assert "size limit" in message or "too large" in message


def test_the_size_limit_grows_with_the_messages(vocab_path) -> None:
    echo = "{% for m in messages %}{{ m.content }}{{ m.content }}{% endfor %}"
    long = [{"role": "user", "content": "y" * (3 << 20)}]  # past the 1 Mi base, within base + 4 per input char
    assert len(render(vocab_path, echo, long)) == 6 << 20


@pytest.mark.parametrize("template", UNSAFE)
def test_the_sandbox_refuses_python_internals_and_mutation(vocab_path, template) -> None:
    assert "unsafe" in refused(vocab_path, template)


def test_real_template_features_render_as_plain_jinja_renders_them(vocab_path) -> None:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v: __import__("json").dumps(v, ensure_ascii=False)
    want = env.from_string(RICH).render(messages=CONVERSATION, add_generation_prompt=True, bos_token="<|endoftext|>",
                                        eos_token="<|im_end|>")
    got = render(vocab_path, RICH, CONVERSATION, TemplateLimits())
    assert got == want
    assert got.startswith("<|endoftext|><|system|>01") and "<|user|>04*And an oxbow?" in got
    assert "A loop in a river." in got and "rivers" not in got and got.endswith("<|assistant|>")


def test_the_models_own_templates_still_render(vocab_path) -> None:
    for arch in ("glm4moe", "qwen3moe"):
        with Tokenizer(vocab_path, build_vocab(arch, 300).chat_template) as tok:
            assert tok.render_chat(CONVERSATION[:2]).count("What is a meander?") == 1


def test_generate_and_chat_with_a_looping_template_are_one_line_errors(tmp_path, synth_model) -> None:
    looping = rewrite_gguf(synth_model("qwen3moe"), tmp_path / "looping.gguf",
                           metadata={"tokenizer.chat_template": LOOPS_FOREVER})
    for args, stdin in ((["generate", str(looping), "--prompt", "hi", "--chat", "-n", "2"], ""),
                        (["chat", str(looping)], "hi\n")):
        start = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "runner.cli", *args], input=stdin, capture_output=True,
                             text=True, timeout=120, check=False)
        assert out.returncode == 1, out.stderr
        errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
        assert errors == [out.stderr.splitlines()[-1]], out.stderr  # one line, the last
        assert errors[0].startswith("error: looping.gguf: the chat template ran past its time limit (5 s)")
        assert time.monotonic() - start < 120
