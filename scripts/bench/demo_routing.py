"""The trained demo model's own expert reuse: per MoE layer, the LRU hit rate of its decode routing; writes JSON.

Greedy answers (end of turn ignored) to chat questions about well-known Debian packages, numpy backend.
Each answer's decode steps are replayed per layer through an LRU cache of S slots that starts empty
(runner/offload/locality_routing.py: lru_hit_rate, the project's LRU policy), the regime the `demo`
calibration preset there is fitted in; the figures are means over answers. The same replay of
uniformly random top-k routing is given beside them, and per layer the share of uses the busiest
quarter of the experts takes and the share of a token's experts the token before also used.
`--model` measures another file the same way (a synthetic one: its random router's reuse).

    python -m scripts.bench.demo_routing --out docs/perf/2026-12-04-routing-locality/demo_routing.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.models.weights import MoEWeights
from runner.offload.locality_routing import lru_hit_rate
from runner.offload.provider import ExpertMatrices, ResidentExperts, moe_layer_index
from scripts.bench.common import environment

DEMO = Path(__file__).resolve().parents[2] / "runner" / "data" / "demo.gguf"
PACKAGES = ("bash", "git", "vim", "python3", "curl", "openssl", "coreutils", "tar", "make", "gcc", "nano", "wget")


@dataclass
class DecodeTrace:
    """An ExpertProvider over the resident experts that records, per MoE layer, each decode step's experts."""

    recording: bool = False
    steps: dict[int, list[list[int]]] = field(default_factory=lambda: defaultdict(list))
    inner: ResidentExperts = field(default_factory=ResidentExperts)

    def fetch(self, w: MoEWeights, experts: Sequence[int]) -> Mapping[int, ExpertMatrices]:
        if self.recording:  # a decode step: one token, so `experts` is its top-k
            self.steps[moe_layer_index(w)].append([int(e) for e in experts])
        return self.inner.fetch(w, experts)


def answers(model: Path, max_tokens: int) -> list[dict[int, np.ndarray]]:
    """Per answer, per MoE layer: the decode steps' experts, int [tokens, k]."""
    trace = DecodeTrace()
    engine = Engine.load(model, EngineConfig(n_ctx=1024), experts=trace)
    out = []
    for name in PACKAGES:
        prompt = engine.tokenizer.encode(engine.tokenizer.render_chat([{"role": "user", "content": f"What is {name}?"}]))
        engine.reset()
        trace.steps.clear()
        for i, _ in enumerate(engine.generate(prompt, max_tokens, SamplingParams(temperature=0.0), ignore_eos=True).steps()):
            trace.recording = True  # the first step came from prefill; the rest are decode steps
        trace.recording = False
        out.append({layer: np.array(steps) for layer, steps in trace.steps.items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEMO)
    ap.add_argument("--max-tokens", type=int, default=97, help="tokens per answer (the first from prefill)")
    ap.add_argument("--slots", default="2,4,8,12")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    slot_counts = [int(s) for s in args.slots.split(",")]
    runs = answers(args.model, args.max_tokens)
    n_expert = int(max(ids.max() for run in runs for ids in run.values())) + 1
    rng = np.random.default_rng(0)
    layers: dict[str, dict] = {}
    for layer in sorted(runs[0]):
        k = runs[0][layer].shape[1]
        real = {s: statistics.fmean(lru_hit_rate(run[layer], s, n_expert) for run in runs) for s in slot_counts}
        rand = {s: statistics.fmean(lru_hit_rate(np.array([rng.choice(n_expert, k, replace=False)
                                                           for _ in range(len(run[layer]))]), s, n_expert)
                                    for run in runs) for s in slot_counts}
        uses = np.bincount(np.concatenate([run[layer].ravel() for run in runs]), minlength=n_expert)
        repeat = statistics.fmean(len(set(a) & set(b)) / k for run in runs for a, b in zip(run[layer][:-1], run[layer][1:]))
        layers[str(layer)] = {"lru_hit_rate": real, "random_routing_lru_hit_rate": rand,
                              "top_quarter_share": float(np.sort(uses)[::-1][: max(1, n_expert // 4)].sum() / uses.sum()),
                              "next_token_repeat": repeat}  # share of a token's experts the token before used
    mean = {s: statistics.fmean(v["lru_hit_rate"][s] for v in layers.values()) for s in slot_counts}
    record = {"benchmark": "demo_routing", "model": args.model.name, "n_expert": n_expert, "k": k,
              "answers": len(runs), "decode_tokens_per_answer": len(runs[0][layer]),
              "regime": "per answer, LRU from an empty cache over its decode steps; mean over answers",
              "mean_over_layers": mean, "layers": layers, "environment": environment(None, vars(args))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(json.dumps({"mean_over_layers": mean, "layers": layers}))


if __name__ == "__main__":
    main()
