"""Per-token cost of constrained decoding: llguidance, xgrammar and outlines-core on one vocabulary.

For each library that imports: build its view of the vocabulary (setup_s), compile a JSON schema and
llama.cpp's generic JSON GBNF grammar (compile_s; outlines-core takes regular expressions only, so
no GBNF), then walk a document the grammar accepts token by token, timing what a decode step pays:
the next-token mask, turned into a numpy bool array over the vocabulary and applied to logits, then
the chosen token consumed. Median, p90 and max per token over all rounds. No GPU involved.

    python -m scripts.bench.bench_grammar_mask [--vocab GGUF ...] [--rounds 20] --out OUT.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from runner.engine.tokenizer import Tokenizer
from runner.package_data import demo_model_path
from scripts.bench.common import environment

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "section": {"type": "string", "enum": ["admin", "devel", "libs", "net", "utils", "web"]},
        "version": {"type": "string"},
        "installed_size": {"type": "integer"},
        "depends": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "section", "version", "depends"],
    "additionalProperties": False,
}
DOCUMENT = ('{"name": "curl", "section": "web", "version": "7.88.1-10+deb12u5", "installed_size": 500, '
            '"depends": ["libc6", "libcurl4", "zlib1g"]}')
# llama.cpp's grammars/json.gbnf
JSON_GBNF = r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
'''


class Vocab:
    """A GGUF's vocabulary as the libraries want it: token bytes (control tokens 0xFF-prefixed, as
    llguidance marks specials), the end-of-generation ids and a tokenize function."""

    def __init__(self, path: Path) -> None:
        tok = Tokenizer(path)
        self.name, self.n = path.name, tok.n_vocab
        self.tokens: list[bytes] = []
        self.special: list[int] = []
        for t in range(self.n):
            piece = tok.token_bytes(t)
            if not piece and tok.token_text(t):
                piece = b"\xff" + tok.token_text(t).encode()
                self.special.append(t)
            self.tokens.append(piece)
        self.eog = sorted(tok.eog_ids)
        self.eos, self.bos = tok.eos_id, tok.bos_id
        self.encode: Callable[[str], list[int]] = lambda s: tok.encode(s, parse_special=False)
        self._tok = tok


def _llguidance(vocab: Vocab) -> dict[str, Any]:
    import llguidance
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    class Wrapped:
        eos_token_id, bos_token_id, tokens, special_token_ids = vocab.eos, vocab.bos, vocab.tokens, vocab.special

        def __call__(self, text: bytes) -> list[int]:
            return vocab.encode(text.decode("utf-8", errors="replace"))

    t0 = time.perf_counter()
    lltok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapped()), eos_token=vocab.eog)
    setup_s = time.perf_counter() - t0
    bitmask = allocate_token_bitmask(1, vocab.n)

    def make(grammar: str) -> Any:
        m = llguidance.LLMatcher(lltok, grammar, log_level=0)
        if m.is_error():
            raise RuntimeError(m.get_error())
        return m

    def mask(m: Any) -> np.ndarray:
        fill_next_token_bitmask(m, bitmask)
        return bitmask

    def consume(m: Any, token: int) -> None:
        if not m.consume_token(token):
            raise RuntimeError(m.get_error())

    grammars = {"json_schema": lambda: llguidance.LLMatcher.grammar_from_json_schema(SCHEMA),
                "gbnf_json": lambda: llguidance.LLMatcher.grammar_from_lark(llguidance.gbnf_to_lark.gbnf_to_lark(JSON_GBNF))}
    return {"version": importlib.metadata.version("llguidance"), "setup_s": setup_s, "grammars": grammars, "make": make, "mask": mask,
            "consume": consume, "reset": lambda m: m.reset()}


def _xgrammar(vocab: Vocab) -> dict[str, Any]:
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo(vocab.tokens, vocab_type=xgr.VocabType.RAW, vocab_size=vocab.n,
                             stop_token_ids=vocab.eog, add_prefix_space=False)
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    setup_s = time.perf_counter() - t0
    bitmask = xgr.allocate_token_bitmask(1, vocab.n)

    def mask(m: Any) -> np.ndarray:
        m.fill_next_token_bitmask(bitmask)
        return bitmask.numpy()

    def consume(m: Any, token: int) -> None:
        if not m.accept_token(token):
            raise RuntimeError(f"token {token} refused")

    grammars = {"json_schema": lambda: compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False),
                "gbnf_json": lambda: compiler.compile_grammar(JSON_GBNF)}
    return {"version": importlib.metadata.version("xgrammar"), "setup_s": setup_s, "grammars": grammars, "make": xgr.GrammarMatcher,
            "mask": mask, "consume": consume, "reset": lambda m: m.reset()}


def _outlines_core(vocab: Vocab) -> dict[str, Any]:
    import outlines_core as oc

    t0 = time.perf_counter()
    ids: dict[bytes, list[int]] = {}
    for t, piece in enumerate(vocab.tokens):
        if piece and t not in vocab.special and t != vocab.eos:
            ids.setdefault(piece, []).append(t)
    oc_vocab = oc.Vocabulary(vocab.eos, ids)
    setup_s = time.perf_counter() - t0
    buf = np.zeros((vocab.n + 31) // 32, dtype=np.int32)

    def mask(guide: Any) -> np.ndarray:
        guide.write_mask_into(buf.ctypes.data, buf.size, 4)
        return buf

    grammars = {"json_schema": lambda: oc.Index(oc.json_schema.build_regex_from_schema(json.dumps(SCHEMA)), oc_vocab)}
    return {"version": importlib.metadata.version("outlines_core"), "setup_s": setup_s, "grammars": grammars,
            "make": oc.Guide, "mask": mask, "consume": lambda g, t: g.advance(t), "reset": lambda g: g.reset()}


LIBRARIES = {"llguidance": _llguidance, "xgrammar": _xgrammar, "outlines-core": _outlines_core}


def measure(lib: dict[str, Any], compile_grammar: Callable[[], Any], tokens: list[int], n: int,
            rounds: int) -> dict[str, Any]:
    """Compile once, then `rounds` walks of `tokens`, in microseconds per token: the library's part (the
    packed mask, then consuming the token) and the whole step (with the mask unpacked and applied)."""
    t0 = time.perf_counter()
    compiled = compile_grammar()
    matcher = lib["make"](compiled)
    compile_s = time.perf_counter() - t0
    logits = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    library_us: list[float] = []
    step_us: list[float] = []
    for r in range(rounds):
        if r:
            lib["reset"](matcher)
        for token in tokens:
            t0 = time.perf_counter()
            packed = lib["mask"](matcher)
            t1 = time.perf_counter()
            allowed = np.unpackbits(packed.view(np.uint8), bitorder="little")[:n].astype(bool)
            masked = np.where(allowed, logits, -np.inf)
            t2 = time.perf_counter()
            lib["consume"](matcher, token)
            t3 = time.perf_counter()
            library_us.append((t1 - t0 + t3 - t2) * 1e6)
            step_us.append((t3 - t0) * 1e6)
            if not np.isfinite(masked[token]):
                raise RuntimeError(f"the mask forbids token {token} of the document")
    return {"compile_s": compile_s, "tokens": len(tokens), "rounds": rounds,
            "library_us_per_token": _spread(library_us), "step_us_per_token": _spread(step_us)}


def _spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "p90": ordered[int(0.9 * (len(ordered) - 1))], "max": ordered[-1],
            "mean": statistics.fmean(ordered)}


def bench_vocab(path: Path, rounds: int) -> dict[str, Any]:
    vocab = Vocab(path)
    tokens = vocab.encode(DOCUMENT)
    out: dict[str, Any] = {"vocab": vocab.name, "n_vocab": vocab.n, "document_tokens": len(tokens), "libraries": {}}
    for name, build in LIBRARIES.items():
        try:
            lib = build(vocab)
        except ImportError as exc:
            out["libraries"][name] = {"available": False, "why": str(exc)}
            continue
        row: dict[str, Any] = {"available": True, "version": lib["version"], "setup_s": lib["setup_s"]}
        for grammar, compile_grammar in lib["grammars"].items():
            try:
                row[grammar] = measure(lib, compile_grammar, tokens, vocab.n, rounds)
            except Exception as exc:  # a library that refuses the workload is a result too
                row[grammar] = {"error": f"{type(exc).__name__}: {exc}"}
        out["libraries"][name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", action="append", type=Path, help="a GGUF whose vocabulary to use (repeatable; "
                                                                "default: the demo model)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    results = [bench_vocab(p, args.rounds) for p in args.vocab or [demo_model_path()]]
    report = {"environment": environment(argv=vars(args)), "schema": SCHEMA, "document": DOCUMENT,
              "gbnf": JSON_GBNF, "results": results}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
