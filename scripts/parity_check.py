"""Compare the runner's reference backend with llama.cpp on any GGUF; print JSON.

Teacher-forced logits over the prompt plus llama.cpp's own greedy continuation (max and median
per-position deviation, argmax agreement, llama.cpp's near-tie count) and free-running greedy
tokens from both (identical prefix length).

    python scripts/parity_check.py MODEL.gguf [--prompt TEXT] [--greedy N] [--json OUT]
"""

from __future__ import annotations

import json
import time

import click
import numpy as np

from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.gguf_file import open_gguf
from runner.parity.llama_oracle import LlamaOracle


@click.command()
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--prompt", default="The quick brown fox jumps over the lazy dog. Offloading experts")
@click.option("--greedy", "n_greedy", default=32, show_default=True)
@click.option("--float-activations", is_flag=True, help="Pure float32 activations instead of llama.cpp's rounding.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None)
def main(model: str, prompt: str, n_greedy: int, float_activations: bool, json_out: str | None) -> None:
    t0 = time.perf_counter()
    engine = Engine(open_gguf(model), EngineConfig(n_ctx=512), NumpyOps(llama_activations=not float_activations))
    tokens = engine.tokenizer.encode(prompt)
    with LlamaOracle(model, n_ctx=512) as oracle:
        want_tokens = oracle.greedy(tokens, n_greedy)
        want = oracle.logits(tokens + want_tokens)
    got = engine.logits_all(tokens + want_tokens)
    engine.reset()
    logits, got_tokens = engine.prefill(tokens), []
    for _ in range(n_greedy):
        got_tokens.append(int(np.argmax(logits)))
        logits = engine.decode(got_tokens[-1])
    deviation = np.abs(got - want).max(axis=-1)
    top2 = np.sort(want, axis=-1)[:, -2:]
    same = next((i for i, (a, b) in enumerate(zip(got_tokens, want_tokens)) if a != b), n_greedy)
    result = {
        "model": model,
        "prompt_tokens": len(tokens),
        "activations": "float32" if float_activations else "llama.cpp rounding",
        "max_abs_logit_deviation": float(deviation.max()),
        "median_abs_logit_deviation": float(np.median(deviation)),
        "logit_std": float(want.std()),
        "argmax_agreement": float((got.argmax(-1) == want.argmax(-1)).mean()),
        "llama_near_ties_below_0.5": int((top2[:, 1] - top2[:, 0] < 0.5).sum()),
        "greedy_identical_prefix": same,
        "greedy_tokens": n_greedy,
        "wall_s": time.perf_counter() - t0,
    }
    text = json.dumps(result, indent=2)
    click.echo(text)
    if json_out:
        with open(json_out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
