"""Constrained decoding: a JSON schema or a GBNF grammar, compiled by llguidance against the model's
vocabulary, and the per-request state that says which tokens may come next.

llguidance was chosen by measurement (docs/perf/2026-12-04-grammar-mask-cpu.md): tens of
microseconds per token on a 152k vocabulary, a JSON schema compiled in under a millisecond,
llama.cpp's GBNF read through its converter, and one dependency-free wheel. Its parser bounds the
work per token (LLParserLimits' defaults), which matters: the grammar comes from the client.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import llguidance
import numpy as np
from llguidance.gbnf_to_lark import gbnf_to_lark

from runner.errors import GenerationError

# A grammar or schema is the client's text: cap it before the converters (GBNF's is pure Python) see it.
MAX_GRAMMAR_CHARS = 256 * 1024
# One space after ',' and ':' and none elsewhere, as json.dumps writes: llguidance's default lets any
# whitespace in between, which a small model repeats until max_tokens. A schema's "x-guidance" may differ.
_JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(GenerationError):
    """A JSON schema or grammar that does not compile, or constrained decoding that cannot go on."""


class GrammarVocab:
    """The model's vocabulary as llguidance sees it: every token's bytes, control tokens marked special
    (a grammar never produces them), and the end-of-generation tokens that end a complete grammar.
    Built once per tokenizer: a pass over the whole vocabulary (about 0.5 s at 152k tokens)."""

    def __init__(self, tokenizer: Any) -> None:
        tokens: list[bytes] = []
        special: list[int] = []
        for t in range(tokenizer.n_vocab):
            piece = tokenizer.token_bytes(t)
            if not piece and tokenizer.token_text(t):  # a control token: llguidance's 0xFF prefix marks it special
                piece = b"\xff" + tokenizer.token_text(t).encode("utf-8")
                special.append(t)
            tokens.append(piece)
        self.n_vocab: int = tokenizer.n_vocab
        self.eog = np.asarray(sorted(tokenizer.eog_ids), dtype=np.int64)

        class _View:  # what llguidance.TokenizerWrapper reads
            eos_token_id, bos_token_id = tokenizer.eos_id, tokenizer.bos_id
            special_token_ids = special

            def __call__(self, text: bytes) -> list[int]:
                return tokenizer.encode(text.decode("utf-8", errors="replace"), parse_special=False)

        _View.tokens = tokens
        self._lltokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_View()), eos_token=self.eog.tolist())

    def json_schema(self, schema: dict[str, Any]) -> Grammar:
        """Output that is one JSON value valid under `schema` (compact: no free whitespace, which small
        models repeat until max_tokens)."""
        _check_size(json.dumps(schema), "the JSON schema")
        source = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_LAYOUT)
        return self._compiled(source, "the JSON schema")

    def gbnf(self, text: str) -> Grammar:
        """Output that llama.cpp's GBNF grammar `text` (its `root` rule) accepts."""
        _check_size(text, "the grammar")
        try:
            lark = gbnf_to_lark(text)
        except Exception as exc:  # the converter raises bare Exceptions (and RecursionError on deep nesting)
            raise GrammarError(f"the grammar does not parse as GBNF: {_one_line(exc)}") from None
        return self._compiled(llguidance.LLMatcher.grammar_from_lark(lark), "the grammar")

    def lark(self, text: str) -> Grammar:
        """Output that a grammar in llguidance's Lark dialect accepts (the server builds these itself)."""
        _check_size(text, "the grammar")
        return self._compiled(llguidance.LLMatcher.grammar_from_lark(text), "the grammar")

    def _compiled(self, source: str, what: str) -> Grammar:
        error = llguidance.LLMatcher.validate_grammar(source, self._lltokenizer)
        if error:
            raise GrammarError(f"{what} is not usable: {_one_line(error)}")
        return Grammar(self, source)

    def matcher(self, source: str) -> Any:
        matcher = llguidance.LLMatcher(self._lltokenizer, source, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"the grammar is not usable: {_first_line(matcher.get_error())}")
        return matcher


@dataclass(frozen=True)
class Grammar:
    """A checked grammar for one vocabulary; `start()` gives one generation's state."""

    vocab: GrammarVocab
    source: str  # llguidance's grammar, serialized

    def start(self) -> GrammarState:
        return GrammarState(self.vocab, self.vocab.matcher(self.source))


class GrammarState:
    """Where one generation is in its grammar: the tokens committed so far, and the mask after them or
    after tokens looked at ahead of them (MTP drafts), which are consumed tentatively and rolled back."""

    def __init__(self, vocab: GrammarVocab, matcher: Any) -> None:
        self._vocab = vocab
        self._matcher = matcher
        self._ahead: list[tuple[int, bool]] = []  # tokens past the committed ones, and whether the matcher took them
        self._masks: dict[tuple[int, ...], np.ndarray] = {}  # by tokens ahead; cleared on commit
        self._packed = np.zeros((vocab.n_vocab + 31) // 32, dtype=np.uint32)

    @property
    def done(self) -> bool:
        """The grammar is complete and nothing but an end-of-generation token may follow."""
        self._move_to(())
        return bool(self._matcher.is_stopped())

    def allowed(self, ahead: Sequence[int] = ()) -> np.ndarray:
        """Which tokens may follow the committed ones and then `ahead` (bool over the vocabulary)."""
        key = tuple(ahead)
        mask = self._masks.get(key)
        if mask is None:
            if key and not self.allowed(key[:-1])[key[-1]]:
                raise ValueError(f"token {key[-1]} ahead is outside the grammar")
            self._move_to(key)
            if self._matcher.is_stopped():  # complete: only an end of generation follows
                mask = np.zeros(self._vocab.n_vocab, dtype=bool)
                mask[self._vocab.eog] = True
            else:
                self._matcher.unsafe_compute_mask_ptr(self._packed.ctypes.data, self._packed.nbytes)
                mask = np.unpackbits(self._packed.view(np.uint8), bitorder="little")[: self._vocab.n_vocab].astype(bool)
            if not mask.any():
                why = _first_line(self._matcher.get_error()) or "the grammar allows no token"
                raise GrammarError(f"constrained decoding cannot go on: {why}")
            self._masks[key] = mask
        return mask

    def accept(self, token: int) -> None:
        """Commit `token`, which the mask after the committed tokens allowed."""
        if not self.allowed(())[token]:
            raise GrammarError(f"token {token} is outside the grammar")
        self._move_to(())
        if not self._matcher.is_stopped():  # an end of generation after a complete grammar changes nothing
            self._matcher.consume_token(token)
        self._masks.clear()

    def _move_to(self, ahead: tuple[int, ...]) -> None:
        common = 0
        for (have, _), want in zip(self._ahead, ahead):
            if have != want:
                break
            common += 1
        consumed = sum(taken for _, taken in self._ahead[common:])
        if consumed:
            self._matcher.rollback(consumed)
        del self._ahead[common:]
        for token in ahead[common:]:
            take = not self._matcher.is_stopped()  # past a complete grammar (an end of generation) nothing changes
            if take:
                self._matcher.consume_token(token)
            self._ahead.append((token, take))
        if self._matcher.is_error():
            raise GrammarError(f"constrained decoding failed: {_first_line(self._matcher.get_error())}")


def _check_size(text: str, what: str) -> None:
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"{what} has {len(text)} characters; at most {MAX_GRAMMAR_CHARS} are accepted")


def _first_line(message: str) -> str:
    """llguidance's matcher errors go on with a dump of its state; the first line says what failed."""
    return message.strip().splitlines()[0] if message.strip() else ""


def _one_line(message: object) -> str:
    return " ".join(str(message).split())
