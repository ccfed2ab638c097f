"""Chat templates are code from the model file: render them in jinja2's immutable sandbox, within a budget.

The sandbox keeps a template away from Python internals (no `__class__`, no list or dict mutation);
the budget keeps it from running forever or filling memory. Rendering is pure Python, so time is
bounded from the inside: every loop iteration, call, attribute or item access, operator, filter and
output statement checks the deadline, and every string or list the template builds, and all the text
it outputs (in macros too), is held to a size. A template past either limit raises
TemplateLimitError at its next step, so no thread is left spinning after its caller gave up.
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import time
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg

# Integers past this many bits are refused by * and ** (no chat template computes such numbers).
_MAX_INT_BITS = 4096
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class TemplateLimits:
    """What one render may spend: seconds, and characters (its output, and any value it builds)."""

    time_s: float = 5.0  # real templates take milliseconds; a loop that does not end stops here
    base_chars: int = 1 << 20  # the size limit is this many characters
    chars_per_input_char: int = 4  # plus this many per character of the messages (templates repeat some)

    def max_chars(self, input_chars: int) -> int:
        return self.base_chars + self.chars_per_input_char * input_chars


class TemplateLimitError(Exception):
    """A render went past its TemplateLimits; the message (one line) says which."""


class _Budget:
    def __init__(self, limits: TemplateLimits, input_chars: int) -> None:
        self.time_s = limits.time_s
        self.deadline = time.monotonic() + limits.time_s
        self.max_chars = limits.max_chars(input_chars)
        self.output_chars = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"the chat template ran past its time limit ({self.time_s:g} s): "
                                     "a loop that does not end?")

    def allow(self, chars: int) -> None:
        """Refuse, before it is built, a value of `chars` characters or items."""
        if chars > self.max_chars:
            raise TemplateLimitError(f"the chat template tried to build a value of {chars} characters or items, "
                                     f"past its size limit ({self.max_chars})")

    def sized(self, value: Any) -> Any:
        if isinstance(value, (str, list, tuple, dict, set)):
            self.allow(len(value))
        return value

    def output(self, text: str) -> str:
        self.tick()
        self.output_chars += len(text)
        if self.output_chars > self.max_chars:
            raise TemplateLimitError(f"the chat template's output passed its size limit ({self.max_chars} characters)")
        return text

    def counted(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            self.tick()
            yield item


# The budget of the render running in this thread (contexts are per thread): the environment and its
# compiled templates are shared by every render of one tokenizer.
_current: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("chat_template_budget", default=None)


# The filter every for loop's iterable goes through (jinja allows no custom node types); a template
# may name it too, to no effect.
_COUNTED = "_counted"


class _BudgetedCodeGenerator(CodeGenerator):
    """Routes loops, output and `~` through the environment's budget hooks (see ChatTemplateEnvironment)."""

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        for loop in node.find_all(nodes.For):  # one tick per iteration
            loop.iter = nodes.Filter(loop.iter, _COUNTED, [], [], None, None, lineno=loop.iter.lineno)
        super().visit_Template(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.sized(")
        super().visit_Concat(node, frame)
        self.write(")")

    # Every output is charged at run time, template text included: text inside a loop in a macro is
    # buffered, not yielded, and would otherwise escape the size limit until the macro returns.
    def _output_child_to_const(self, node: nodes.Expr, frame: Frame, finalize: Any) -> str:
        raise nodes.Impossible()

    def _output_child_pre(self, node: nodes.Expr, frame: Frame, finalize: Any) -> None:
        self.write("environment.output(")
        super()._output_child_pre(node, frame, finalize)

    def _output_child_post(self, node: nodes.Expr, frame: Frame, finalize: Any) -> None:
        super()._output_child_post(node, frame, finalize)
        self.write(")")


class _GenerationTag(Extension):
    """Hugging Face's `{% generation %}...{% endgeneration %}` (it marks the assistant's tokens for training
    masks): renders its body as is, as llama-cpp-python's Jinja2ChatFormatter does."""

    tags = frozenset({"generation"})  # type: ignore[assignment]  # jinja only iterates it

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # HF's tojson: plain json.dumps, not jinja's HTML-escaping one (GLM's templates pass ensure_ascii=False).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _check_format(budget: _Budget, fmt: str, args: Any) -> None:
    """`fmt % args` or `fmt.format(...)`: a width or precision in the format is a size."""
    for digits in _DIGITS.findall(fmt):
        if len(digits) > 12:
            budget.allow(budget.max_chars + 1)
        budget.allow(int(digits))
    if "*" in fmt:  # "%*d": the width comes from the arguments
        for arg in args if isinstance(args, tuple) else (args,):
            if isinstance(arg, int):
                budget.allow(arg)


def _check_str_method(budget: _Budget, name: str, s: str, args: tuple[Any, ...]) -> None:
    """Refuse a str method call (or filter of the same job) whose result would pass the size limit."""
    if name in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        budget.allow(args[0])
    elif name == "expandtabs":
        size = args[0] if args and isinstance(args[0], int) else 8
        budget.allow(len(s) * max(size, 1))
    elif name == "replace" and len(args) >= 2 and isinstance(args[1], str):
        count = args[2] if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0 else len(s) + 1
        budget.allow(len(s) + min(count, len(s) + 1) * len(args[1]))
    elif name == "join" and args and hasattr(args[0], "__len__"):
        budget.allow(len(s) * max(len(args[0]) - 1, 0))
    elif name in ("format", "format_map"):
        _check_format(budget, s, ())


def _check_filter(budget: _Budget, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    value, rest = (args[0], args[1:]) if args else (None, ())
    if name in ("center", "replace") and isinstance(value, str):
        _check_str_method(budget, name, value, rest)
    elif name == "indent" and isinstance(value, str):
        width = rest[0] if rest else kwargs.get("width", 4)
        width_chars = width if isinstance(width, int) else len(str(width))
        budget.allow(len(value) + (value.count("\n") + 1) * width_chars)
    elif name == "join" and hasattr(value, "__len__"):
        sep = rest[0] if rest else kwargs.get("d", "")
        budget.allow(len(str(sep)) * max(len(value) - 1, 0))
    elif name in ("slice", "batch") and rest and isinstance(rest[0], int):
        budget.allow(rest[0])
    elif name == "tojson" and isinstance(indent := kwargs.get("indent", rest[1] if len(rest) > 1 else None), int):
        budget.allow(indent * 64)  # an indent per nesting level and line (HF's order: ensure_ascii, indent)
    elif name == "format" and isinstance(value, str):
        _check_format(budget, value, rest)


def _budgeted_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    skip = 1 if _PassArg.from_obj(f) is not None else 0  # the context or environment jinja passes first

    @functools.wraps(f)  # keeps jinja's pass_context / pass_environment marker
    def run(*args: Any, **kwargs: Any) -> Any:
        budget = _current.get()
        if budget is None:
            return f(*args, **kwargs)
        budget.tick()
        _check_filter(budget, name, args[skip:], kwargs)
        return budget.sized(f(*args, **kwargs))

    return run


class ChatTemplateEnvironment(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, set up as Hugging Face renders chat templates, with the budget's hooks."""

    code_generator_class = _BudgetedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self) -> None:
        # optimized=False: no constant folding, which would call filters at compile time, outside any budget.
        # The extensions are Hugging Face's: real templates use {% break %}, {% continue %} and {% generation %}.
        super().__init__(trim_blocks=True, lstrip_blocks=True, optimized=False,
                         extensions=[loopcontrols, _GenerationTag])
        self.filters["tojson"] = _tojson
        self.filters = {name: _budgeted_filter(name, f) for name, f in self.filters.items()}
        self.filters[_COUNTED] = self.counted_iter
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        del self.globals["lipsum"]  # lipsum(n) writes n paragraphs in one call; no chat template uses it

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # jinja's would print as "" and fail only when used further; a template reaching for Python
        # internals is refused at once.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe.")

    # -- hooks the compiled template calls ------------------------------------------------------
    def counted_iter(self, iterable: Iterable[Any]) -> Iterable[Any]:
        budget = _current.get()
        return iterable if budget is None else budget.counted(iterable)

    def output(self, text: str) -> str:
        budget = _current.get()
        return text if budget is None else budget.output(text)

    def sized(self, value: Any) -> Any:
        budget = _current.get()
        return value if budget is None else budget.sized(value)

    def getattr(self, obj: Any, attribute: str) -> Any:
        budget = _current.get()
        if budget is not None:
            budget.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        budget = _current.get()
        if budget is not None:
            budget.tick()
        return super().getitem(obj, argument)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        budget = _current.get()
        if budget is None:
            return super().call(context, obj, *args, **kwargs)
        budget.tick()
        method_of = getattr(obj, "__self__", None)
        if isinstance(method_of, str) and isinstance(obj, types.BuiltinMethodType):
            _check_str_method(budget, obj.__name__, method_of, args)
        elif getattr(obj, "__name__", None) in ("format", "format_map"):  # the sandbox's wrapped str.format
            fmt = getattr(getattr(obj, "__wrapped__", None), "__self__", None)
            if isinstance(fmt, str):
                _check_format(budget, fmt, ())
        return budget.sized(super().call(context, obj, *args, **kwargs))

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = _current.get()
        if budget is not None:
            budget.tick()
            _check_binop(budget, operator, left, right)
            return budget.sized(super().call_binop(context, operator, left, right))
        return super().call_binop(context, operator, left, right)


def _check_binop(budget: _Budget, operator: str, left: Any, right: Any) -> None:
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "*":
        if ints and left.bit_length() + right.bit_length() > _MAX_INT_BITS:
            raise TemplateLimitError("the chat template tried to build a number too large to be useful")
        for seq, n in ((left, right), (right, left)):
            if isinstance(n, int) and hasattr(seq, "__len__") and not isinstance(seq, int):
                budget.allow(len(seq) * n)
    elif operator == "**" and ints and abs(left) > 1 and right * left.bit_length() > _MAX_INT_BITS:
        raise TemplateLimitError("the chat template tried to build a number too large to be useful")
    elif operator == "+" and hasattr(left, "__len__") and hasattr(right, "__len__"):
        budget.allow(len(left) + len(right))
    elif operator == "%" and isinstance(left, str):
        _check_format(budget, left, right)


def compile_template(source: str) -> jinja2.Template:
    """The template compiled in a ChatTemplateEnvironment; jinja2.TemplateError if it does not parse."""
    return ChatTemplateEnvironment().from_string(source)


def render(template: jinja2.Template, limits: TemplateLimits, input_chars: int, **context: Any) -> str:
    """Render within `limits` (the size limit grows with `input_chars`, the characters of the messages)."""
    token = _current.set(_Budget(limits, input_chars))
    try:
        return template.render(**context)
    finally:
        _current.reset(token)
