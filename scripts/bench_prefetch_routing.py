"""Can a layer's experts be predicted one layer early? Next-layer prefetch measured on real routing.

The prefetch idea (issue 4): while layer i runs, apply layer i+1's router to the hidden state at
hand and upload the experts it picks, so layer i+1 finds them in its slots. Whether that can pay is
first a question of routing, which random-weight models do not have: this replays greedy decode on
the trained demo model (numpy backend) and, at every MoE layer, compares the experts the router
picks from the layer's real input (after its attention) with two predictions:
- early: the same router on the state one step earlier (the layer's input before attention, i.e.
  the previous layer's output);
- ahead: what segmented decode can use without another sync, made at the previous MoE layer's
  lookup from that layer's post-attention state (its router input before its own ffn_norm, normed
  with this layer's ffn_norm as this layer's router input is). The first MoE layer has none.
Then an LRU slot cache per layer is replayed over the same decode routing: as is, and with each
layer's predicted experts (of either kind) inserted just before the layer looks up its real ones; a
prediction that was already held costs nothing, one that was not is an extra upload, wasted if the
layer does not use it. The GPU timing of overlapping those uploads with compute is not measured here.

    python scripts/bench_prefetch_routing.py runner/data/demo.gguf --data .demo --out prefetch.json
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_demo import environment, routing_bench_setup  # noqa: E402

from runner.engine.engine import Engine  # noqa: E402
from runner.models.transformer import attention_block, dense_ffn  # noqa: E402
from runner.models.weights import MoEWeights  # noqa: E402

Routing = dict[int, tuple[list[int], list[int], list[int]]]  # MoE layer -> (routed, predicted early, ahead)
PREDICTIONS = {"early": 1, "ahead": 2}  # a prediction's place in a layer's Routing tuple


def step_routing(engine: Engine, token: int) -> tuple[Routing, int]:
    """Decode `token` (the engine's forward, spelled out) and the greedy next token; per MoE layer,
    the routed experts, those the same router picks from the layer's input before its attention, and
    those it picks from the previous MoE layer's post-attention state (ahead: [] for the first)."""
    model, ops, cfg, kv = engine.model, engine.ops, engine.model_config, engine.kv
    layers = model.weights.layers
    moe = [i for i, lw in enumerate(layers) if isinstance(lw.ffn, MoEWeights)]
    next_moe = dict(zip(moe, moe[1:]))
    positions = kv.positions(1)
    x = ops.embed(model.weights.token_embd, np.asarray([token]))
    out = {}
    ahead: dict[int, list[int]] = {}
    for i, lw in enumerate(layers):
        x_in = x
        x = x + attention_block(ops, cfg, lw, x, positions, kv, i)
        h = ops.rms_norm(x, lw.ffn_norm, cfg.rms_eps)
        if isinstance(lw.ffn, MoEWeights):
            w = lw.ffn
            ids, weights = ops.route(ops.linear(h, w.router), w.probs_bias, cfg)
            early, _ = ops.route(ops.linear(ops.rms_norm(x_in, lw.ffn_norm, cfg.rms_eps), w.router), w.probs_bias, cfg)
            if i in next_moe:
                nxt = layers[next_moe[i]]
                pred, _ = ops.route(ops.linear(ops.rms_norm(x, nxt.ffn_norm, cfg.rms_eps), nxt.ffn.router),
                                    nxt.ffn.probs_bias, cfg)
                ahead[next_moe[i]] = [int(e) for e in np.asarray(pred)[0]]
            out[i] = ([int(e) for e in np.asarray(ids)[0]], [int(e) for e in np.asarray(early)[0]], ahead.get(i, []))
            ffn = ops.moe(h, ids, weights, w)
            if w.shared is not None:
                ffn = ffn + dense_ffn(ops, w.shared, h)
        else:
            ffn = dense_ffn(ops, lw.ffn, h)
        x = x + ffn
    kv.advance(1)
    logits, _ = model.head(x)
    engine.kv_tokens.append(token)
    return out, int(np.argmax(np.asarray(logits)[-1]))


def trace(engine: Engine, prompts: list[list[int]], max_tokens: int) -> tuple[list[Routing], list[list[int]]]:
    """Routing of every greedy decode step after each prompt, and the tokens decoded."""
    steps, decoded = [], []
    for prompt in prompts:
        engine.reset()
        token = int(np.argmax(engine.prefill(prompt)))
        decoded.append([token])
        for _ in range(max_tokens - 1):
            routing, token = step_routing(engine, token)
            steps.append(routing)
            decoded[-1].append(token)
    return steps, decoded


def replay(steps: list[Routing], slots: int, prediction: str | None) -> dict:
    """LRU per layer over the decode steps; with a `prediction` (early or ahead) each layer first loads
    the experts it predicted."""
    caches: dict[int, OrderedDict[int, None]] = {}
    hits = misses = prefetched = wasted = 0

    def touch(cache: OrderedDict[int, None], e: int) -> bool:
        held = e in cache
        cache[e] = None
        cache.move_to_end(e)
        if len(cache) > slots:
            cache.popitem(last=False)
        return held

    for step in steps:
        for layer, routing in step.items():
            routed = routing[0]
            cache = caches.setdefault(layer, OrderedDict())
            if prediction is not None:
                for e in routing[PREDICTIONS[prediction]]:
                    if not touch(cache, e):
                        prefetched += 1
                        wasted += e not in routed
            for e in routed:
                if touch(cache, e):
                    hits += 1
                else:
                    misses += 1
    lookups = hits + misses
    return {"hit_rate": hits / lookups, "misses_per_token": misses / len(steps),
            "prefetch_uploads_per_token": prefetched / len(steps), "wasted_per_token": wasted / len(steps),
            "uploads_per_token": (misses + prefetched) / len(steps)}


def main() -> None:
    args, engine, prompts, slot_counts = routing_bench_setup(__doc__)
    steps, _ = trace(engine, prompts, args.max_tokens)
    k = engine.model_config.n_expert_used
    layers = sorted(steps[0])
    recall = {name: {layer: float(np.mean([len(set(s[layer][0]) & set(s[layer][at])) / k for s in steps]))
                     for layer in layers if steps[0][layer][at]}
              for name, at in PREDICTIONS.items()}
    result = {"decode_steps": len(steps), "n_expert": engine.model_config.n_expert, "top_k": k,
              "recall_by_layer": recall["early"], "recall": float(np.mean(list(recall["early"].values()))),
              "ahead_recall_by_layer": recall["ahead"], "ahead_recall": float(np.mean(list(recall["ahead"].values()))),
              "slots": {s: {"lru": replay(steps, s, None), "lru_with_prefetch": replay(steps, s, "early"),
                            "lru_with_prefetch_ahead": replay(steps, s, "ahead")}
                        for s in slot_counts}}
    report = {"benchmark": "prefetch_routing", "model": args.model.name, "environment": environment(args.model),
              "prompts": args.prompts, "max_tokens": args.max_tokens, **result}
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
