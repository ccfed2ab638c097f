"""A chat conversation on one engine: history, prompts that reuse the KV prefix, per-turn stats, save/load.

No terminal here: `runner/cli/chat.py` drives a ChatSession from a REPL, tests drive it directly.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from runner.cli.support import not_utf8, read_small_file
from runner.engine.generation import Generation
from runner.engine.sampling import SamplingParams
from runner.errors import USER_ERRORS, ChatError
from runner.offload.figures import counted_steps

FILE_FORMAT = "runner-chat/1"
FILE_MAX_BYTES = 4 << 20  # a saved chat takes about 10 bytes a token (text and reply ids): 400k tokens fit
FILE_MAX_DEPTH = 4  # object > "messages" list > message object > "tokens" list
SEED_LIMIT = 2**64  # seeds are 64-bit, as the server's are
_ROLES = ("user", "assistant")
_FILE_KEYS = ("format", "model", "system", "messages", "settings")
_MESSAGE_KEYS = ("role", "content", "tokens", "interrupted")


@dataclass(frozen=True)
class ChatSettings:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None  # None: a fresh random seed every turn
    max_tokens: int = 512

    def __post_init__(self) -> None:
        # Types first: the settings may come from a chat file, where "1" or true or [1] can stand for a number.
        for name in ("temperature", "top_p", "min_p"):
            if not _is_number(getattr(self, name)):
                raise ChatError(f"{name} must be a number, got {_short(getattr(self, name))}")
        for name in ("top_k", "max_tokens"):
            if not _is_int(getattr(self, name)):
                raise ChatError(f"{name} must be an integer, got {_short(getattr(self, name))}")
        if self.seed is not None and not (_is_int(self.seed) and 0 <= self.seed < SEED_LIMIT):
            raise ChatError(f"seed must be null or an integer from 0 to 2^64-1, got {_short(self.seed)}")
        if self.max_tokens < 1:
            raise ChatError(f"max_tokens must be >= 1, got {self.max_tokens}")
        self.sampling(0)  # SamplingParams checks the ranges (finite, top_p in (0, 1], ...)

    def sampling(self, turn: int) -> SamplingParams:
        # A fixed seed per session, offset per turn: replies are reproducible without repeating one draw.
        seed = None if self.seed is None else self.seed + turn
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p, seed)


@dataclass(frozen=True)
class Message:
    role: str  # "user" or "assistant"
    content: str
    tokens: tuple[int, ...] | None = None  # an assistant reply's generated ids: re-rendered as is
    interrupted: bool = False


@dataclass(frozen=True)
class TurnStats:
    """One reply's figures. The optional ones come from later backends (via Generation.timings())."""

    prompt_tokens: int
    cached_tokens: int
    prefill_s: float
    prefill_tok_s: float
    completion_tokens: int
    decode_s: float
    decode_tok_s: float
    finish_reason: str  # "stop", "length" or "interrupted"
    context_full: bool = False  # the reply was cut at the end of the context, not at max_tokens
    draft_acceptance: float | None = None  # MTP drafts accepted / proposed
    cache_hit_rate: float | None = None  # expert cache hits / lookups in this turn
    pcie_bytes: int | None = None  # bytes uploaded host -> device for this turn

    FROM_TIMINGS = {"draft_acceptance": "draft_acceptance", "cache_hit_rate": "cache_hit_rate",
                    "pcie_bytes": "bytes_uploaded"}  # field -> Generation.timings() key

    @property
    def new_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @classmethod
    def from_generation(cls, gen: Generation, context_full: bool = False) -> "TurnStats":
        t = gen.timings()
        extra = {k: t[key] for k, key in cls.FROM_TIMINGS.items() if t.get(key) is not None}
        return cls(t["prompt_tokens"], t["cached_tokens"], t["prefill_s"], t["prefill_tok_s"],
                   t["completion_tokens"], t["decode_s"], t["decode_tok_s"],
                   gen.finish_reason or "interrupted", context_full, **extra)


@dataclass(frozen=True)
class ChatTotals:
    turns: int = 0
    interrupted: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefill_s: float = 0.0
    completion_tokens: int = 0
    decoded_tokens: int = 0  # completion tokens after each turn's first, which prefill produced
    decode_s: float = 0.0

    def __add__(self, t: TurnStats) -> "ChatTotals":
        return ChatTotals(self.turns + 1, self.interrupted + (t.finish_reason == "interrupted"),
                          self.prompt_tokens + t.prompt_tokens, self.cached_tokens + t.cached_tokens,
                          self.prefill_s + t.prefill_s, self.completion_tokens + t.completion_tokens,
                          self.decoded_tokens + max(t.completion_tokens - 1, 0), self.decode_s + t.decode_s)

    @property
    def prefill_tok_s(self) -> float:
        return (self.prompt_tokens - self.cached_tokens) / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decoded_tokens / self.decode_s if self.decode_s > 0 else 0.0


class ChatSession:
    """The conversation so far and the engine it runs on; one `chat()` call per user turn."""

    def __init__(self, engine: Any, settings: ChatSettings, system: str | None = None, draft: Any = None) -> None:
        self.engine = engine
        self.draft = draft  # a spec.config.DraftConfig for every reply, or None: plain decoding
        self.settings = settings
        self.system = system
        self.messages: list[Message] = []
        self.totals = ChatTotals()
        self.last: TurnStats | None = None
        engine.tokenizer.render_chat([{"role": "user", "content": "hi"}])  # no template: fail now, not mid-chat

    def reset(self) -> None:
        """Forget the conversation (the system prompt and the totals stay)."""
        self.messages = []

    # -- prompts ----------------------------------------------------------------------------------
    def prompt_tokens(self, messages: list[Message]) -> list[int]:
        """The template rendering of `messages` as token ids, with each reply's own generated ids spliced in.

        Re-tokenizing a reply's text rarely gives the ids the model sampled (BPE prefers merges, bytes of a
        split character become U+FFFD), which would break the KV prefix. So the template is rendered with
        a marker in place of each reply, the text between markers is tokenized and the reply ids go between.
        The splice is used only if the template passes the markers through exactly as it would the text.
        """
        tok = self.engine.tokenizer
        head = [{"role": "system", "content": self.system}] if self.system is not None else []
        text = tok.render_chat(head + [{"role": m.role, "content": m.content} for m in messages])
        replies = [m for m in messages if m.tokens is not None]
        marks = [f"\ue000{i}\ue001" for i in range(len(replies))]
        if replies:
            marked = iter(marks)
            marked_chat = [{"role": m.role, "content": next(marked) if m.tokens is not None else m.content}
                         for m in messages]
            parts = _split(tok.render_chat(head + marked_chat), marks)
            if parts and text == "".join(p + r.content for p, r in zip(parts, replies)) + parts[-1]:
                ids = tok.encode(parts[0], add_special=True, parse_special=True)
                for reply, part in zip(replies, parts[1:]):
                    ids += list(reply.tokens)
                    ids += tok.encode(part, add_special=False, parse_special=True) if part else []
                return ids
        return tok.encode(text, add_special=True, parse_special=True)

    # -- a turn -----------------------------------------------------------------------------------
    def chat(self, text: str, on_text: Callable[[str], None] = lambda s: None,
             should_stop: Callable[[], bool] = lambda: False) -> TurnStats:
        """Reply to `text`, streaming pieces to `on_text`; `should_stop()` true after a token ends the reply.

        The reply joins the history even when stopped (marked interrupted); on an error before it starts
        the conversation is unchanged.
        """
        messages = self.messages + [Message("user", text)]
        prompt = self.prompt_tokens(messages)
        n_ctx = self.engine.n_ctx
        room = n_ctx - len(prompt)
        if room < 1:
            raise ChatError(f"context full: the conversation needs {len(prompt)} tokens and the context holds "
                            f"{n_ctx}; /reset to start over (or restart with a larger --n-ctx)")
        max_tokens = min(self.settings.max_tokens, room)
        turn = sum(m.role == "assistant" for m in messages)
        extra = {"draft": self.draft} if self.draft is not None else {}
        gen = self.engine.generate(prompt, max_tokens, self.settings.sampling(turn), cancelled=should_stop, **extra)
        steps = counted_steps(self.engine, gen)
        try:
            for step in steps:
                if step.text:
                    on_text(step.text)
                if should_stop():
                    break
        finally:
            steps.close()  # the engine stops after the current token
        stats = TurnStats.from_generation(gen, context_full=gen.finish_reason == "length" and max_tokens == room)
        content = self.engine.tokenizer.decode(gen.tokens)  # == gen.text when it ran to the end
        self.messages = messages + [Message("assistant", content, tuple(gen.tokens), gen.finish_reason is None)]
        self.totals += stats
        self.last = stats
        return stats

    # -- files ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        messages = []
        for m in self.messages:
            d: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.tokens is not None:
                d["tokens"] = list(m.tokens)
            if m.interrupted:
                d["interrupted"] = True
            messages.append(d)
        return {"format": FILE_FORMAT, "model": self.engine.tokenizer.name, "system": self.system,
                "messages": messages, "settings": {**dataclasses.asdict(self.settings), "n_ctx": self.engine.n_ctx}}

    def save(self, path: str | Path) -> None:
        """Write the conversation to `path`, a regular file (a FIFO without a reader would block the session)."""
        data = _dumps(self.to_dict()).encode("utf-8")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o666)
        except OSError as exc:  # ENXIO: a FIFO that nobody reads
            why = "not a regular file" if exc.errno == errno.ENXIO else exc.strerror or exc
            raise ChatError(f"cannot save to {path}: {why}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ChatError(f"cannot save to {path}: not a regular file")
            os.ftruncate(fd, 0)
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(data)
        except OSError as exc:
            raise ChatError(f"cannot save to {path}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)

    def load(self, path: str | Path) -> None:
        """Replace the system prompt, conversation and sampling settings with those saved in `path`.

        The file is untrusted input: at most FILE_MAX_BYTES, nested no deeper than a chat file is, every field
        of the type it should be; anything else is one ChatError and the session is left as it was.
        """
        raw = read_small_file(path, FILE_MAX_BYTES, "chat file", ChatError)
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ChatError(f"{path} is not a JSON chat file: not UTF-8 ({exc.reason} at byte {exc.start})") from None
        except RecursionError:
            raise ChatError(f"{path} is not a chat file: nested deeper than JSON parsing goes (a chat file has "
                            f"{FILE_MAX_DEPTH} levels)") from None
        except ValueError as exc:
            raise ChatError(f"{path} is not a JSON chat file: {exc}") from None
        system, messages, settings = _parse(data, self.engine.tokenizer, str(path), self.engine.n_ctx)
        try:
            new_settings = dataclasses.replace(self.settings, **settings)
        except USER_ERRORS as exc:
            raise ChatError(f"{path}: bad settings: {exc}") from None
        self.system, self.messages, self.settings = system, messages, new_settings


def _dumps(data: dict[str, Any]) -> str:
    """Indented JSON with one message per line, so token id lists do not take a line per id."""
    body = {k: v for k, v in data.items() if k != "messages"}
    head = json.dumps(body, indent=2, ensure_ascii=False)[:-2]
    lines = ",\n".join("    " + json.dumps(m, ensure_ascii=False) for m in data["messages"])
    return f'{head},\n  "messages": [\n{lines}\n  ]\n}}\n' if lines else f'{head},\n  "messages": []\n}}\n'


def _split(text: str, marks: list[str]) -> list[str] | None:
    """`text` cut at each mark in order (len(marks) + 1 parts), or None if a mark is not there exactly once."""
    parts = []
    for mark in marks:
        if text.count(mark) != 1:
            return None
        before, text = text.split(mark)
        parts.append(before)
    return parts + [text]


def _parse(data: Any, tokenizer: Any, where: str, n_ctx: int) -> tuple[str | None, list[Message], dict[str, Any]]:
    """The system prompt, messages and ChatSettings fields of a chat file's JSON, every field's type checked."""
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise ChatError(f"{where}: not a chat file (an object with a 'messages' list)")
    _known_keys(data, _FILE_KEYS, where)
    if data.get("format", FILE_FORMAT) != FILE_FORMAT:
        raise ChatError(f"{where}: format {_short(data['format'])} is not {FILE_FORMAT!r}, the one this runner reads")
    if data.get("model") is not None:
        _text(data["model"], f"{where}: 'model'")
    system = data.get("system")
    if system is not None:
        _text(system, f"{where}: 'system'")
    if len(data["messages"]) > n_ctx:  # every message takes at least one token
        raise ChatError(f"{where}: {len(data['messages'])} messages cannot fit a context of {n_ctx} tokens")
    messages = [_message(m, i, tokenizer, where) for i, m in enumerate(data["messages"])]
    settings = data.get("settings", {})
    if not isinstance(settings, dict):
        raise ChatError(f"{where}: 'settings' must be an object")
    fields = [f.name for f in dataclasses.fields(ChatSettings)]
    _known_keys(settings, [*fields, "n_ctx"], f"{where}: settings")
    n_ctx_saved = settings.get("n_ctx")  # what the file was saved with: informational, the engine's stays
    if n_ctx_saved is not None and not (_is_int(n_ctx_saved) and n_ctx_saved >= 1):
        raise ChatError(f"{where}: settings: n_ctx must be a positive integer, got {_short(n_ctx_saved)}")
    return system, messages, {k: v for k, v in settings.items() if k in fields}


def _message(m: Any, i: int, tokenizer: Any, where: str) -> Message:
    if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
        raise ChatError(f"{where}: message {i} needs a role ({' or '.join(_ROLES)}) and a string content")
    _known_keys(m, _MESSAGE_KEYS, f"{where}: message {i}")
    _text(m["content"], f"{where}: message {i}'s content")
    tokens, interrupted = m.get("tokens"), m.get("interrupted", False)
    if tokens is not None and not (isinstance(tokens, list) and all(_is_int(t) for t in tokens)):
        raise ChatError(f"{where}: message {i}'s tokens must be a list of token ids")
    if not isinstance(interrupted, bool):
        raise ChatError(f"{where}: message {i}'s interrupted must be true or false, got {_short(interrupted)}")
    # Saved ids are kept only while they still spell the content (someone may have edited the text, or the file
    # comes from another model's vocabulary).
    valid = (m["role"] == "assistant" and tokens is not None
             and all(0 <= t < tokenizer.n_vocab for t in tokens) and tokenizer.decode(tokens) == m["content"])
    return Message(m["role"], m["content"], tuple(tokens) if valid else None, interrupted)


def _known_keys(obj: dict[str, Any], known: Any, where: str) -> None:
    unknown = sorted(set(obj) - set(known))
    if unknown:
        raise ChatError(f"{where}: unknown field {_short(unknown[0])} (known: {', '.join(known)})")


def _text(value: Any, what: str) -> None:
    """Refuse what is not a string, or holds a lone surrogate (JSON may escape one), which no tokenizer encodes."""
    if not isinstance(value, str):
        raise ChatError(f"{what} must be a string, got {_short(value)}")
    problem = not_utf8(value)
    if problem:
        raise ChatError(f"{what} is {problem}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _short(value: Any, limit: int = 40) -> str:
    """`value` for an error line, cut short: a hostile file must not flood the terminal, and a deeply nested
    list must not be repr'd at all (repr recurses)."""
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "an object"
    text = repr(value[:limit] if isinstance(value, str) else value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
