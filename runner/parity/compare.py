"""The runner's numpy reference against llama.cpp on any GGUF, as figures (`runner parity`).

Teacher-forced logits over the prompt plus llama.cpp's own greedy continuation (max and median
per-position deviation, argmax agreement, llama.cpp's near-tie count) and free-running greedy
tokens from both (identical prefix length). docs/parity.md says what to expect of each.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from runner.backends.kv_type import DEFAULT_KV_TYPE
from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.errors import GenerationError
from runner.gguf_file import open_gguf
from runner.parity.llama_oracle import LlamaOracle

N_CTX = 512  # both sides' context: the prompt and the greedy tokens must fit
NEAR_TIE = 0.5  # logits: a top-2 margin below this lets a rounding difference flip llama.cpp's argmax


def compare(model: str | Path, prompt: str, n_greedy: int, float_activations: bool = False,
            kv_type: str = DEFAULT_KV_TYPE) -> dict[str, Any]:
    """Figures of the reference against llama.cpp on `model` for `prompt` and `n_greedy` greedy tokens, both
    caching K/V as `kv_type`; `float_activations` turns off the reference's copy of llama.cpp's activation
    rounding (pure float32)."""
    t0 = time.perf_counter()
    ops = NumpyOps(llama_activations=not float_activations, kv_type=kv_type)
    engine = Engine(open_gguf(model), EngineConfig(n_ctx=N_CTX), ops)
    tokens = engine.tokenizer.encode(prompt)
    if not tokens:
        raise GenerationError("the prompt is empty")
    if len(tokens) + n_greedy > N_CTX:
        raise GenerationError(f"the prompt ({len(tokens)} tokens) and {n_greedy} greedy tokens exceed the context "
                              f"of {N_CTX}")
    with LlamaOracle(model, n_ctx=N_CTX, kv_type=kv_type) as oracle:
        want_tokens = oracle.greedy(tokens, n_greedy)
        want = oracle.logits(tokens + want_tokens)  # [T, n_vocab]
    got = engine.logits_all(tokens + want_tokens)  # teacher-forced on llama.cpp's continuation
    got_tokens = _greedy(engine, tokens, n_greedy)
    deviation = np.abs(got - want).max(axis=-1)  # [T]
    top2 = np.sort(want, axis=-1)[:, -2:]
    same = next((i for i, (a, b) in enumerate(zip(got_tokens, want_tokens)) if a != b), n_greedy)
    return {
        "model": str(model),
        "prompt_tokens": len(tokens),
        "activations": "float32" if float_activations else "llama.cpp rounding",
        "kv_type": kv_type,
        "max_abs_logit_deviation": float(deviation.max()),
        "median_abs_logit_deviation": float(np.median(deviation)),
        "logit_std": float(want.std()),
        "argmax_agreement": float((got.argmax(-1) == want.argmax(-1)).mean()),
        f"llama_near_ties_below_{NEAR_TIE}": int((top2[:, 1] - top2[:, 0] < NEAR_TIE).sum()),
        "greedy_identical_prefix": same,
        "greedy_tokens": n_greedy,
        "wall_s": time.perf_counter() - t0,
    }


def _greedy(engine: Engine, prompt: list[int], n: int) -> list[int]:
    """The reference's free-running greedy continuation of `prompt` (end-of-generation tokens not stopped on)."""
    engine.reset()
    logits, out = engine.prefill(prompt), []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = engine.decode(out[-1])
    return out
