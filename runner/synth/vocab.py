"""A deterministic byte-level BPE vocabulary for synthesized GGUF models and the trained demo model.

The vocabulary is real enough for llama.cpp to load and tokenize with: 256 byte tokens, merges
learned from a corpus, padding up to the requested size, then the architecture's special tokens
and chat template. Random-weight models learn their merges from a small embedded English corpus
(the point is a tokenizer that exercises a real model's code paths); the trained demo model
(scripts/build_corpus.py) learns them from its own training text.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import gguf

if TYPE_CHECKING:
    from collections.abc import Iterator

# Learning beyond this many merges would need a bigger corpus and more time; huge real-sized
# vocabularies (151552, 151936) get the learned merges plus cheap padding instead.
MAX_LEARNED_MERGES = 4096
# A pair seen once is memorization, not structure; stop there and pad.
_MIN_PAIR_COUNT = 2
_CORPUS_PATH = Path(__file__).with_name("corpus.txt")

# Close to the qwen2/glm4 pre-tokenizer regex, written for the stdlib `re` (no \p{..}):
# [^\W\d_] stands for \p{L}, \d for \p{N}, and "[^\s\w]|_" for [^\s\p{L}\p{N}].
_PRE_SPLIT = re.compile(
    r"'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])"
    r"|(?:[^\r\n\w]|_)?[^\W\d_]+"
    r"|\d"
    r"| ?(?:[^\s\w]|_)+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what llama.cpp's BPE decoding undoes)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


BYTE_TO_UNICODE: dict[int, str] = _byte_to_unicode()


def to_mapped(text: str) -> str:
    """The byte-level (mapped) form of `text`, as token texts and merges spell it."""
    return "".join(BYTE_TO_UNICODE[b] for b in text.encode("utf-8"))


@dataclass(frozen=True)
class _ArchStyle:
    pre: str
    specials: tuple[str, ...]
    eos: str
    eot: str | None
    bos: str | None
    eom: str | None
    pad: str | None
    chat_template: str


# GLM-4.5 style. With add_generation_prompt the prompt ends "<|assistant|>\n"; the model ends its
# turn by emitting <|user|> (eot) or <|observation|> (eom, a tool call), as in real GLM GGUFs.
_GLM_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'observation'] -%}"
    "{{- raise_exception('unsupported role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)

_CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}"
    "{{- raise_exception('unsupported role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_STYLES: dict[str, _ArchStyle] = {
    # "glm4" makes llama.cpp use the ChatGLM4 pre-tokenizer and no default BOS.
    "glm4moe": _ArchStyle(
        pre="glm4",
        specials=(
            "<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>",
            "<|assistant|>", "<|observation|>",
        ),
        eos="<|endoftext|>", eot="<|user|>", bos=None, eom="<|observation|>", pad=None,
        chat_template=_GLM_TEMPLATE,
    ),
    # Like Qwen3 GGUFs: eos/eot <|im_end|>, <|endoftext|> as pad and (never added) bos; without
    # an explicit bos llama.cpp's BPE default would be token 11, a byte token.
    "qwen3moe": _ArchStyle(
        pre="qwen2",
        specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        eos="<|im_end|>", eot="<|im_end|>", bos="<|endoftext|>", eom=None, pad="<|endoftext|>",
        chat_template=_CHATML_TEMPLATE,
    ),
}
# The hybrid Qwen families' synthetic vocabularies are qwen3moe's: the qwen2 pre-tokenizer (which
# _PRE_SPLIT follows) and ChatML (real Qwen3.5 files name their own pre-tokenizer, "qwen35").
_STYLES["qwen35moe"] = _STYLES["qwen3next"] = _STYLES["qwen3moe"]

ARCHS: frozenset[str] = frozenset(_STYLES)


@dataclass(frozen=True)
class VocabSpec:
    tokens: list[str]  # byte-level (GPT-2 mapped) token texts; special tokens verbatim
    token_types: list[int]  # gguf.TokenType values
    merges: list[str]  # "a b" pairs in mapped form, in rank order
    pre: str  # tokenizer.ggml.pre
    bos_id: int | None
    eos_id: int
    eot_id: int | None
    add_bos: bool
    chat_template: str
    eom_id: int | None = None
    pad_id: int | None = None
    special_ids: dict[str, int] = field(default_factory=dict)  # special token text -> id


def _merge_word(word: tuple[str, ...], pair: tuple[str, str], merged: str) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(merged)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _pairs(word: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    return zip(word, word[1:])


def train_merges(text: str, max_merges: int) -> list[tuple[str, str]]:
    """Greedy BPE over pre-split words: repeatedly merge the most frequent adjacent pair.

    Ties go to the lexicographically smallest pair, and nothing depends on set or hash order,
    so the result is the same in every process. Pair counts are updated incrementally and the
    best pair comes from a heap with stale entries skipped, which keeps thousands of merges fast.
    """
    word_counts = Counter(to_mapped(piece) for piece in _PRE_SPLIT.findall(text))
    ordered = sorted(word_counts)
    words = [tuple(w) for w in ordered]
    freq = [word_counts[w] for w in ordered]

    pair_counts: dict[tuple[str, str], int] = defaultdict(int)
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i, word in enumerate(words):
        for pair in _pairs(word):
            pair_counts[pair] += freq[i]
            where[pair].add(i)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    merges: list[tuple[str, str]] = []
    while heap and len(merges) < max_merges:
        neg_count, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -neg_count:
            continue  # stale heap entry
        if -neg_count < _MIN_PAIR_COUNT:
            break
        merges.append(pair)
        merged = pair[0] + pair[1]
        touched: set[tuple[str, str]] = set()
        for i in where.pop(pair):
            old = words[i]
            new = _merge_word(old, pair, merged)
            if new == old:
                continue  # index entry outlived the pair in this word
            for p in _pairs(old):
                pair_counts[p] -= freq[i]
                touched.add(p)
            for p in _pairs(new):
                pair_counts[p] += freq[i]
                where[p].add(i)
                touched.add(p)
            words[i] = new
        pair_counts.pop(pair, None)
        for p in touched:
            count = pair_counts.get(p, 0)
            if count > 0:
                heapq.heappush(heap, (-count, p))
            else:
                pair_counts.pop(p, None)
    return merges


@lru_cache(maxsize=1)
def _learned_merges() -> tuple[tuple[str, str], ...]:
    # Greedy BPE is prefix-consistent: a smaller run is a prefix of this one, so train once.
    return tuple(train_merges(_CORPUS_PATH.read_text(encoding="utf-8"), MAX_LEARNED_MERGES))


def _padding_names() -> Iterator[str]:
    """'Ġa', 'Ġb', ..., 'Ġz', 'Ġaa', ...: valid mapped text (a space, then letters)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    n = 0
    while True:
        n += 1
        name, k = "", n
        while k:  # bijective base 26
            k, r = divmod(k - 1, 26)
            name = letters[r] + name
        yield BYTE_TO_UNICODE[ord(" ")] + name


def build_vocab(arch: str, vocab_size: int, corpus: str | None = None) -> VocabSpec:
    """The vocabulary of an `arch` model with exactly `vocab_size` tokens.

    Merges are learned from `corpus` when given (a trained model's own text), else from the
    small embedded corpus that synthesized models share.
    """
    style = _STYLES.get(arch)
    if style is None:
        raise ValueError(f"no synthetic vocabulary for architecture {arch!r}; choose from {sorted(ARCHS)}")
    minimum = 256 + len(style.specials)
    if vocab_size < minimum:
        raise ValueError(f"vocab_size {vocab_size} is too small for {arch}: need at least {minimum}")

    tokens = [BYTE_TO_UNICODE[b] for b in range(256)]
    known = set(tokens)
    # Keep learned and padding texts away from the special tokens' verbatim texts.
    reserved = set(style.specials)
    n_normal = vocab_size - len(style.specials)

    # A few spare merges: two merges can spell the same token, and those add no token.
    learned = _learned_merges() if corpus is None else train_merges(corpus, n_normal - 256 + 64)
    merges: list[str] = []
    for left, right in learned:
        if len(tokens) >= n_normal:
            break
        merges.append(f"{left} {right}")
        text = left + right
        if text not in known:  # two merges can spell the same token; keep the first id
            tokens.append(text)
            known.add(text)
    if any(text in reserved for text in tokens):
        raise AssertionError("a learned token collides with a special token")

    names = _padding_names()
    while len(tokens) < n_normal:
        text = next(names)
        if text not in known:
            tokens.append(text)
            known.add(text)

    token_types = [int(gguf.TokenType.NORMAL)] * len(tokens)
    special_ids: dict[str, int] = {}
    for text in style.specials:
        special_ids[text] = len(tokens)
        tokens.append(text)
        token_types.append(int(gguf.TokenType.CONTROL))

    def sid(text: str | None) -> int | None:
        return None if text is None else special_ids[text]

    return VocabSpec(
        tokens=tokens,
        token_types=token_types,
        merges=merges,
        pre=style.pre,
        bos_id=sid(style.bos),
        eos_id=special_ids[style.eos],
        eot_id=sid(style.eot),
        add_bos=False,
        chat_template=style.chat_template,
        eom_id=sid(style.eom),
        pad_id=sid(style.pad),
        special_ids=special_ids,
    )


def write_vocab_only(path: Path, arch: str, spec: VocabSpec) -> Path:
    """A GGUF with the vocabulary alone: enough for a vocab_only load, to tokenize before a model exists."""
    writer = gguf.GGUFWriter(str(path), arch)  # general.architecture and tokenizer keys; no hparams, no tensors
    write_vocab(writer, spec)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_vocab(writer: gguf.GGUFWriter, spec: VocabSpec) -> None:
    """Add the tokenizer.ggml.* keys and tokenizer.chat_template for `spec` to `writer`."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(spec.pre)
    writer.add_token_list(spec.tokens)
    writer.add_token_types(spec.token_types)
    writer.add_token_merges(spec.merges)
    if spec.bos_id is not None:
        writer.add_bos_token_id(spec.bos_id)
    writer.add_eos_token_id(spec.eos_id)
    if spec.eot_id is not None:
        writer.add_eot_token_id(spec.eot_id)
    if spec.eom_id is not None:
        writer.add_eom_token_id(spec.eom_id)
    if spec.pad_id is not None:
        writer.add_pad_token_id(spec.pad_id)
    writer.add_add_bos_token(spec.add_bos)
    if spec.chat_template:  # "" means no template: the key is left out, as in a base model
        writer.add_chat_template(spec.chat_template)
