"""Tokenizer and chat template of any GGUF model, through llama.cpp's vocabulary loaded alone.

llama.cpp is the reference for how a GGUF vocabulary tokenizes (pre-tokenizer regexes, special
token parsing, EOG detection), so we use it rather than reimplementing BPE. Chat templates are
rendered with jinja2 the way Hugging Face does, since llama.cpp only knows built-in templates, in
a sandbox with time and size limits (chat_template.py): the template is code from the file.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import io
import os
import sys
import tempfile
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import llama_cpp

from runner.engine.chat_template import TemplateLimitError, TemplateLimits, compile_template, render
from runner.errors import TokenizerError

_backend_ready = False


@contextlib.contextmanager
def _captured_output() -> Iterator[io.StringIO]:
    """Swallow everything written to stdout/stderr, Python- and C-level, and hand it back.

    llama-cpp-python's log callback prints to sys.stderr and ggml may write to the raw file
    descriptors; a model load must stay silent, but its error lines make our error message.
    """
    captured = io.StringIO()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as sink:
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                yield captured
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            captured.write(sink.read().decode("utf-8", errors="replace"))


def _last_error(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    # llama.cpp logs the cause ("error loading model: ...") before its closing "failed to load model"
    errors = [line for line in lines if "error" in line.lower()]
    failures = [line for line in lines if "failed" in line.lower()]
    return (errors or failures or lines or ["no message from llama.cpp"])[-1]


def _one_line(message: object) -> str:
    return " ".join(str(message).split())


def _chars(value: Any) -> int:
    """The characters of every string in a (nested) message or template argument: what sizes a render's budget."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(k) + _chars(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(_chars(v) for v in value)
    return 0


class IncrementalDecoder:
    """Turns a token stream into text, holding back bytes until they form whole UTF-8 characters."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        # The stdlib decoder buffers an incomplete trailing sequence and replaces invalid bytes
        # exactly as bytes.decode(errors="replace") does, so the pieces add up to decode().
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._utf8.decode(self._tokenizer.token_bytes(token))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class Tokenizer:
    """The vocabulary of one GGUF file. `chat_template` overrides the file's own when given; every render
    of it keeps within `template_limits`."""

    def __init__(self, model_path: str | Path, chat_template: str | None = None,
                 template_limits: TemplateLimits | None = None) -> None:
        global _backend_ready
        path = Path(model_path)
        self.name = path.name
        if not path.is_file():
            raise TokenizerError(f"{path}: no such model file")
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        with _captured_output() as log:
            if not _backend_ready:
                llama_cpp.llama_backend_init()
                _backend_ready = True
            model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
        if not model:
            raise TokenizerError(f"{self.name}: llama.cpp cannot load the vocabulary: {_one_line(_last_error(log.getvalue()))}")
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self._pieces: dict[int, bytes] = {}
        self._template: jinja2.Template | None = None
        self.template_limits = template_limits or TemplateLimits()

        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)
        bos = llama_cpp.llama_vocab_bos(self._vocab)
        self.bos_id: int | None = bos if bos >= 0 else None
        eos = llama_cpp.llama_vocab_eos(self._vocab)
        if eos < 0:
            self.close()
            raise TokenizerError(f"{self.name}: the vocabulary has no end-of-sequence token")
        self.eos_id: int = eos
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.add_eos: bool = bool(llama_cpp.llama_vocab_get_add_eos(self._vocab))

        if chat_template is None:
            raw = llama_cpp.llama_model_chat_template(model, None)
            chat_template = raw.decode("utf-8") if raw else None
        self.chat_template: str | None = chat_template

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        model, self._model = getattr(self, "_model", None), None
        if model:
            llama_cpp.llama_model_free(model)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self) -> Tokenizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tokens -----------------------------------------------------------------------------

    @cached_property
    def eog_ids(self) -> frozenset[int]:
        # A scan of the whole vocabulary (llama.cpp exposes no list); done once, on first use.
        return frozenset(t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t))

    def _check(self, token: int) -> None:
        if not 0 <= token < self.n_vocab:
            raise TokenizerError(f"{self.name}: token id {token} is out of range (vocabulary has {self.n_vocab} tokens)")

    def is_eog(self, token: int) -> bool:
        self._check(token)
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids of `text`; add_special adds BOS/EOS as the model asks, parse_special turns
        special-token texts like "<|im_end|>" into their single ids instead of plain text."""
        data = text.encode("utf-8")
        capacity = len(data) + 8  # at most one token per byte, plus BOS/EOS
        for _ in range(2):
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            capacity = -n
        raise TokenizerError(f"{self.name}: cannot tokenize a text of {len(data)} bytes")

    def token_bytes(self, token: int) -> bytes:
        """The bytes `token` stands for; empty for control tokens, which are never rendered."""
        piece = self._pieces.get(token)
        if piece is None:
            self._check(token)
            size = 64
            while True:
                buf = ctypes.create_string_buffer(size)
                n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, size, 0, False)
                if n >= 0:
                    piece = buf.raw[:n]
                    break
                size = -n
            self._pieces[token] = piece
        return piece

    def token_text(self, token: int) -> str:
        """The token's text as stored in the vocabulary (mapped form; specials verbatim)."""
        self._check(token)
        return llama_cpp.llama_vocab_get_text(self._vocab, token).decode("utf-8", errors="replace")

    def decode(self, tokens: list[int]) -> str:
        # Concatenated pieces, not llama_detokenize: that one may "clean up" spaces before
        # punctuation (glm4 vocabularies), which breaks round trips and streaming equality.
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def decoder(self) -> IncrementalDecoder:
        return IncrementalDecoder(self)

    # -- chat -------------------------------------------------------------------------------

    def _compiled_template(self) -> jinja2.Template:
        if self._template is None:
            if self.chat_template is None:
                raise TokenizerError(
                    f"{self.name}: the model has no tokenizer.chat_template; pass a template explicitly"
                )
            try:
                self._template = compile_template(self.chat_template)
            except jinja2.TemplateError as exc:
                raise TokenizerError(f"{self.name}: the chat template does not parse: {_one_line(exc)}") from exc
        return self._template

    def _special_text(self, token: int | None) -> str:
        return "" if token is None else self.token_text(token)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **context: Any) -> str:
        """The conversation as the model's chat template writes it, `context` (tools, enable_thinking ...)
        passed to the template too, less a leading bos_token (trailing eos_token) where encode(add_special=True)
        adds it, as llama-server renders; TokenizerError (one line) when the template fails, runs past its
        time limit or builds too much."""
        template = self._compiled_template()
        input_chars = _chars(messages) + _chars(context)
        bos, eos = self._special_text(self.bos_id), self._special_text(self.eos_id)
        try:
            text = render(template, self.template_limits, input_chars,
                          **context,
                          messages=messages,
                          add_generation_prompt=add_generation_prompt,
                          bos_token=bos,
                          eos_token=eos)
        except TemplateLimitError as exc:
            raise TokenizerError(f"{self.name}: {exc}") from None
        except TokenizerError:
            raise
        except Exception as exc:  # template code can fail in any way; report it as one line
            raise TokenizerError(f"{self.name}: the chat template failed: {_one_line(exc) or type(exc).__name__}") from exc
        # Else a template that writes bos_token (Llama 3's "{{- bos_token }}...") starts the prompt with two BOS
        # tokens; llama-server (common/chat.cpp) drops it the same way.
        if self.add_bos and bos and text.startswith(bos):
            text = text[len(bos):]
        if self.add_eos and eos and text.endswith(eos):
            text = text[:-len(eos)]
        return text
