"""A reply's thinking split from its answer, as llama-server's `--reasoning-format deepseek` does.

A model whose chat template knows `<think>` writes its reasoning first, between `<think>` and
`</think>` (or, when the prompt already ends in an open `<think>`, from its first token). That text
goes to `reasoning_content`, the rest to `content`. Streamed text arrives in arbitrary pieces, so a
tail that could still become a tag is held back until the next piece says what it is.
"""

from __future__ import annotations

from typing import Literal

from runner.engine.stopping import partial_suffix

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"

Kind = Literal["reasoning_content", "content"]
Piece = tuple[Kind, str]


def template_thinks(template: str | None) -> bool:
    """Whether a chat template writes thinking blocks (so replies are split by default)."""
    return template is not None and OPEN_TAG in template


def prompt_opens_thinking(prompt_text: str) -> bool:
    """A generation prompt that ends inside `<think>` (DeepSeek-R1's, GLM's forced thinking): the reply
    starts with reasoning and has no opening tag of its own."""
    text = prompt_text.rstrip()
    return text.endswith(OPEN_TAG)


class ReasoningSplitter:
    """Feed text with `push`, then `flush` at the end; each returns the (kind, text) pieces now certain."""

    def __init__(self, in_reasoning: bool = False) -> None:
        # start: the reply may still open with <think>; reasoning: inside it; after: just closed
        # (leading whitespace of the answer dropped); content: the rest.
        self._state = "reasoning" if in_reasoning else "start"
        self._held = ""

    def push(self, text: str) -> list[Piece]:
        self._held += text
        out: list[Piece] = []
        while self._held:
            before = (self._state, len(self._held))
            out += self._step()
            if (self._state, len(self._held)) == before:
                break  # waiting for more text
        return [p for p in out if p[1]]

    def flush(self) -> list[Piece]:
        held, self._held = self._held, ""
        if self._state == "reasoning":
            return [("reasoning_content", held)] if held else []  # cut off while thinking (max_tokens)
        if self._state == "after":
            held = held.lstrip()
        return [("content", held)] if held else []

    def _step(self) -> list[Piece]:
        held = self._held
        if self._state == "start":
            stripped = held.lstrip()
            if stripped.startswith(OPEN_TAG):
                self._state, self._held = "reasoning", stripped[len(OPEN_TAG):]
            elif not OPEN_TAG.startswith(stripped):
                self._state = "content"
            return []
        if self._state == "reasoning":
            end = held.find(CLOSE_TAG)
            if end >= 0:
                self._state, self._held = "after", held[end + len(CLOSE_TAG):]
                return [("reasoning_content", held[:end])]
            keep = partial_suffix(held, CLOSE_TAG)
            self._held = held[len(held) - keep:]
            return [("reasoning_content", held[:len(held) - keep])]
        if self._state == "after":
            self._held = held.lstrip()
            if self._held:
                self._state = "content"
            return []
        self._held = ""
        return [("content", held)]


def split_reasoning(text: str, in_reasoning: bool = False) -> tuple[str | None, str]:
    """(reasoning_content or None, content) of a whole reply."""
    splitter = ReasoningSplitter(in_reasoning)
    pieces = splitter.push(text) + splitter.flush()
    reasoning = "".join(t for kind, t in pieces if kind == "reasoning_content")
    content = "".join(t for kind, t in pieces if kind == "content")
    return reasoning or None, content

