"""Host time a generated token spends choosing itself from the logits (runner/engine/sampling.py); writes JSON.

What the generation loop does per token after the logits reach the host: the penalties and logit_bias
(`penalised`), then the sampler (greedy argmax, or llama.cpp's chain top-k -> top-p -> min-p ->
temperature and a draw), and with `logprobs` the top-n log-probabilities. Timed on synthetic float32
logits of a real vocabulary size, two shapes: `flat` (normal, std 3: random weights' logits, where top-p
reaches far down the order) and `peaked` (the same plus a few clear favourites, as a trained model's).
Median, min and max of --rounds rounds of --tokens tokens. No GPU involved: this is CPU time on the
decode critical path, between one token's logits and the next step's launch.

    python -m scripts.bench.bench_sampler --out sampler.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from runner.engine.generation import _logprobs, penalised
from runner.engine.sampling import Sampler, SamplingParams
from scripts.bench.common import environment, summary, write_result

SETTINGS = {  # name -> SamplingParams fields
    "greedy": {"temperature": 0.0},
    "defaults (0.8, top-k 40, top-p 0.95, min-p 0.05)": {},
    "qwen (0.7, top-k 20, top-p 0.8)": {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.0},
    "no top-k (top-p 0.95, min-p 0.05)": {"top_k": 0},
    "no top-k, top-p 0.95": {"top_k": 0, "min_p": 0.0},
    "temperature only": {"top_k": 0, "top_p": 1.0, "min_p": 0.0},
}


def logits_of(shape: str, vocab: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal(vocab) * 3
    if shape == "peaked":
        x[rng.choice(vocab, 5, replace=False)] += np.array([16.0, 14.0, 13.0, 12.0, 11.0])
    return x.astype(np.float32)


def per_token_ms(params: SamplingParams, logits: list[np.ndarray], logprobs: int | None) -> float:
    sampler, counts = Sampler(params), {int(t): 1 for t in range(0, 4000, 20)}  # 200 tokens generated so far
    t0 = time.perf_counter()
    for row in logits:
        token = sampler(penalised(row, counts, params))
        if logprobs is not None:
            _logprobs(row, token, logprobs)
    return (time.perf_counter() - t0) / len(logits) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[151936, 248320],
                    help="vocabulary sizes (Qwen3 and GLM-4.5: 151,552-151,936; Qwen3.5: 248,320)")
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    for vocab in args.vocab:
        for shape in ("flat", "peaked"):
            logits = [logits_of(shape, vocab, rng) for _ in range(args.tokens)]
            for name, fields in SETTINGS.items():
                for logprobs in (None, 5) if name == "greedy" else (None,):
                    params = SamplingParams(seed=1, repeat_penalty=1.1, **fields)
                    ms = [per_token_ms(params, logits, logprobs) for _ in range(args.rounds)]
                    rows.append({"vocab": vocab, "logits": shape, "setting": name, "logprobs": logprobs,
                                 "ms_per_token": summary(ms)})
                    print(f"{vocab:>7} {shape:6} {name:48} logprobs={logprobs} {rows[-1]['ms_per_token']['median']:.3f} ms")
    write_result({"benchmark": "bench_sampler", "environment": environment(argv=vars(args)), "rows": rows,
                  "note": "CPU time per token, penalties (repeat_penalty 1.1 over 200 generated tokens) included"},
                 args.out)


if __name__ == "__main__":
    main()
