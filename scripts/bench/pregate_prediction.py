"""How well a MoE layer's input predicts the next MoE layer's experts (pre-gating), measured on greedy decoding: JSON.

For each decoded token and each pair of consecutive MoE layers (L, L + 1), layer L + 1's norm and router are
applied to layer L's input to its feed-forward half (the residual stream before L's experts, known a whole MoE
and attention block before L + 1's router runs), and the top (k + extra) experts of that are held against the
k that L + 1's router then picks. The share they cover is what a cache could fetch a layer ahead of the misses
(issue 20: an offloaded token's misses wait for their layer's router, so the link idles between layers); how
often the guess's first d are right (`precision_of_first`) sets how much link a prefetch of d experts wastes.

Usage: python -m scripts.bench.pregate_prediction MODEL.gguf [--tokens 32] [--extra 0,5,10] [--out f.json]
Runs on the numpy backend (the reference); a seed-shape file cut to a few layers (runner synth --preset seed
--layers 4) gives the full shape's routers.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.models.weights import MoEWeights
from scripts.bench.common import environment, write_result


class RouterInputs(NumpyOps):
    """NumpyOps that keeps each one-row norm_route call's input and chosen ids, by router name."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, np.ndarray, np.ndarray]] = []

    def norm_route(self, x, norm, eps, router, probs_bias, cfg, beside=False):
        h, ids, weights = super().norm_route(x, norm, eps, router, probs_bias, cfg, beside)
        if x.shape[0] == 1:
            self.calls.append((router.name, np.array(x), np.array(ids)))
        return h, ids, weights


def predicted_shares(path: Path, tokens: int, extras: list[int]) -> dict:
    ops = RouterInputs()
    engine = Engine.load(path, EngineConfig(n_ctx=tokens + 64), ops=ops)
    cfg = engine.model.cfg
    moe = [lw for lw in engine.model.weights.layers if isinstance(lw.ffn, MoEWeights)]
    next_of = {a.ffn.router.name: b for a, b in zip(moe, moe[1:])}
    prompt = list(range(5, 37))
    gen = engine.generate(prompt, tokens, SamplingParams(temperature=0.0), ignore_eos=True).run()
    covered = {m: [] for m in extras}  # per (token, layer pair): the share of L + 1's experts covered
    depths = sorted({max(1, cfg.n_expert_used // 4), max(1, cfg.n_expert_used // 2), cfg.n_expert_used})
    precise = {d: [] for d in depths}  # per (token, layer pair): the share of the guess's first d that L + 1 uses
    reference = NumpyOps()
    reference.cache = ops.cache  # the same weight views, read once
    decode_calls = ops.calls[-len(moe) * (len(gen.tokens) - 1):]  # the prompt's rows took the multi-row path
    for (name, x, _), (next_name, _, ids) in zip(decode_calls, decode_calls[1:]):
        b = next_of.get(name)
        if b is None or b.ffn.router.name != next_name:
            continue  # a token's last MoE layer: the next call is the next token's first
        actual = set(ids[0].tolist())
        for m in extras:  # the next layer's norm, router and selection rule (bias, groups), k + m deep
            wider = dataclasses.replace(cfg, n_expert_used=min(cfg.n_expert, cfg.n_expert_used + m))
            _, guess, _ = reference.norm_route(x, b.ffn_norm, cfg.rms_eps, b.ffn.router, b.ffn.probs_bias, wider)
            covered[m].append(len(actual & set(guess[0].tolist())) / len(actual))
            if m == extras[0]:
                for d in depths:  # the guess ranks best first: how often are its first d right
                    precise[d].append(len(actual & set(guess[0][:d].tolist())) / d)
    return {
        "model": str(path), "experts": cfg.n_expert, "top_k": cfg.n_expert_used, "moe_layers": len(moe),
        "decoded_tokens": len(gen.tokens), "layer_pairs": len(covered[extras[0]]),
        "chance": round(cfg.n_expert_used / cfg.n_expert, 4),
        "covered": {f"top_k+{m}": round(float(np.mean(v)), 4) for m, v in covered.items()},
        # a prefetch's wasted fills follow from these: a wrong guess is an expert fetched for nothing
        "precision_of_first": {str(d): round(float(np.mean(v)), 4) for d, v in precise.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--extra", default="0,5,10", help="experts fetched beyond top-k, comma-separated")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result = predicted_shares(args.model, args.tokens, [int(m) for m in args.extra.split(",")])
    result["environment"] = environment(argv=vars(args))
    write_result(result, args.out)


if __name__ == "__main__":
    main()
