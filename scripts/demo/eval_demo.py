"""Measure the exported demo model with the runner: perplexity, llama.cpp parity, MTP, expert locality.

On the numpy backend (CPU), from the GGUF alone:
- held-out perplexity on the windows the training script scored (its eval.json), window by window;
- llama.cpp (llama-cpp-python, CPU) on one held-out window: logits and free-running greedy tokens;
- MTP drafting at fixed depth 3 on chat prompts about held-out packages (answers of a fixed length,
  end-of-turn ignored, as every decode figure here): acceptance per depth, the
  greedy output checked equal to plain decoding's, decode tok/s with and without drafting (A/B
  alternated, median of --runs; numpy CPU figures, not the CUDA backend's);
- the routing of those decodes: expert popularity, reuse distance per MoE layer and the hit rate of an
  LRU cache replaying the trace per slot count, next to the same figures for uniformly random routing,
  and the hit rate the runner's own slot cache (EngineConfig.offload) counts at each slot count.

    python3 -m scripts.demo.eval_demo MODEL.gguf --data .demo [--train-eval DIR/eval.json] [--out report.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.environment import environment as runner_environment
from runner.models.weights import MoEWeights
from runner.offload.offload import OffloadConfig
from runner.offload.provider import ExpertMatrices, ExpertProvider, ResidentExperts, moe_layer_index
from runner.parity.llama_oracle import LlamaOracle
from runner.spec.config import DraftConfig

GREEDY = SamplingParams(temperature=0.0)


def window_losses(engine: Engine, stream: np.ndarray, seq: int, n_windows: int) -> list[float]:
    """Mean next-token loss of each of the first n_windows windows of `seq` tokens, each from an empty cache."""
    out = []
    for w in range(n_windows):
        tokens = stream[w * seq : (w + 1) * seq].astype(np.int64)
        logits = engine.logits_all(tokens.tolist()).astype(np.float64)  # [seq, vocab]
        top = logits.max(-1, keepdims=True)
        log_z = np.log(np.exp(logits - top).sum(-1)) + top[:, 0]
        out.append(float((log_z[:-1] - logits[np.arange(seq - 1), tokens[1:]]).mean()))
    return out


def perplexity(model: Path, stream: np.ndarray, seq: int, n_windows: int, trained: dict | None) -> dict:
    engine = Engine.load(model, EngineConfig(n_ctx=seq, ubatch=seq))
    losses = window_losses(engine, stream, seq, n_windows)
    report: dict[str, Any] = {"windows": n_windows, "window_tokens": seq, "runner_loss": statistics.fmean(losses),
                              "runner_ppl": float(np.exp(statistics.fmean(losses))), "runner_window_loss": losses}
    if trained is not None:  # the training script's fp32 losses on the same windows
        theirs = trained["test_fp32"]["window_loss"][:n_windows]
        report.update(train_script_loss=statistics.fmean(theirs), train_script_ppl=float(np.exp(statistics.fmean(theirs))),
                      max_abs_window_loss_diff=max(abs(a - b) for a, b in zip(losses, theirs)),
                      train_script_all_windows_ppl=trained["test_fp32"]["ppl"])
    return report


def llama_parity(model: Path, tokens: list[int], prompt: list[int], n_greedy: int) -> dict:
    """Logits on a held-out window and a free-running greedy continuation, runner (llama.cpp's activation
    rounding) against llama.cpp."""
    engine = Engine.load(model, EngineConfig(n_ctx=len(tokens)), ops=NumpyOps(llama_activations=True))
    with LlamaOracle(model, n_ctx=len(tokens)) as oracle:
        want = oracle.logits(tokens)
        want_greedy = oracle.greedy(prompt, n_greedy)
    got = engine.logits_all(tokens)
    got_greedy = engine.generate(prompt, n_greedy, GREEDY, ignore_eos=True).run().tokens
    deviation = np.abs(got - want).max(-1)
    same = next((i for i, (a, b) in enumerate(zip(got_greedy, want_greedy)) if a != b), n_greedy)
    return {"positions": len(tokens), "max_abs_logit_diff": float(deviation.max()),
            "median_abs_logit_diff": float(np.median(deviation)), "logit_std": float(want.std()),
            "argmax_agreement": float((got.argmax(-1) == want.argmax(-1)).mean()),
            "greedy_tokens": n_greedy, "greedy_identical_prefix": same}


@dataclass
class RoutingTrace:
    """An ExpertProvider in front of another: records the experts each decode step (one token) asks for."""

    inner: ExpertProvider
    recording: bool = False
    steps: dict[int, list[frozenset[int]]] = field(default_factory=lambda: defaultdict(list))  # layer -> per token

    def fetch(self, w: MoEWeights, experts: Sequence[int]) -> Mapping[int, ExpertMatrices]:
        if self.recording:
            self.steps[moe_layer_index(w)].append(frozenset(experts))
        return self.inner.fetch(w, experts)


def reuse_distances(steps: list[frozenset[int]]) -> list[int | None]:
    """Per expert use (a step's experts in ascending order): how many other experts were used in the
    steps strictly between this use and the last one (None: first use)."""
    last: dict[int, int] = {}
    out: list[int | None] = []
    for t, experts in enumerate(steps):
        for e in sorted(experts):
            out.append(len(set().union(*steps[last[e] + 1 : t]) - {e}) if e in last else None)
        for e in experts:
            last[e] = t
    return out


def lru_hits(steps: list[frozenset[int]], slots: int) -> list[bool]:
    """Per expert use, in reuse_distances' order: held by an LRU cache of `slots` that admits each step's
    experts after serving it (a use at reuse distance d hits when d < slots - (k - 1), misses when d >= slots;
    in between it depends on the order the experts of one step were admitted in)."""
    cache: OrderedDict[int, None] = OrderedDict()
    out: list[bool] = []
    for experts in steps:
        out += [e in cache for e in sorted(experts)]
        for e in sorted(experts):
            cache[e] = None
            cache.move_to_end(e)
        while len(cache) > slots:
            cache.popitem(last=False)
    return out


def locality(steps: list[frozenset[int]], n_expert: int, slot_counts: list[int]) -> dict:
    counts = np.zeros(n_expert)
    for experts in steps:
        counts[list(experts)] += 1
    share = np.sort(counts)[::-1] / counts.sum()
    dist = reuse_distances(steps)
    known = [d for d in dist if d is not None]
    return {"tokens": len(steps), "popularity_sorted": [round(float(s), 4) for s in share],
            "top_quarter_share": float(share[: max(1, n_expert // 4)].sum()),
            "median_reuse_distance": float(np.median(known)) if known else None,
            "lru_hit_rate": {s: statistics.fmean(lru_hits(steps, s)) for s in slot_counts}}


def random_steps(n_tokens: int, n_expert: int, k: int, seed: int) -> list[frozenset[int]]:
    rng = np.random.default_rng(seed)
    return [frozenset(rng.choice(n_expert, size=k, replace=False).tolist()) for _ in range(n_tokens)]


def decode_routing(model: Path, prompts: list[list[int]], max_tokens: int, slot_counts: list[int]) -> dict:
    trace = RoutingTrace(ResidentExperts())  # handed to the engine: its forwards' Step takes it as provider
    engine = Engine.load(model, EngineConfig(n_ctx=1024), experts=trace)
    for prompt in prompts:
        gen = engine.generate(prompt, max_tokens, GREEDY, ignore_eos=True)
        gen.on_prefilled = lambda: setattr(trace, "recording", True)  # decode steps only
        gen.run()
        trace.recording = False
    cfg = engine.model_config
    layers = {}
    for layer, steps in sorted(trace.steps.items()):
        layers[layer] = {"real": locality(steps, cfg.n_expert, slot_counts),
                         "random_routing": locality(random_steps(len(steps), cfg.n_expert, cfg.n_expert_used, layer),
                                                    cfg.n_expert, slot_counts)}
    return {"layers": layers, "runner_cache": {s: cache_hit_rate(model, prompts, max_tokens, s) for s in slot_counts}}


def cache_hit_rate(model: Path, prompts: list[list[int]], max_tokens: int, slots: int, policy: str = "lru") -> dict:
    """Decode-only hit rate of the runner's slot cache (`policy`, `slots` per layer; prompts streamed)."""
    engine = Engine.load(model, EngineConfig(n_ctx=1024, offload=OffloadConfig(cache_slots=slots, cache_policy=policy)))
    hits = misses = 0
    for prompt in prompts:
        before: dict = {}
        gen = engine.generate(prompt, max_tokens, GREEDY, ignore_eos=True)
        gen.on_prefilled = lambda: before.update(engine.stats()["cache"]["total"])  # decode steps only
        gen.run()
        after = engine.stats()["cache"]["total"]
        hits, misses = hits + after["hits"] - before["hits"], misses + after["misses"] - before["misses"]
    return {"hits": hits, "misses": misses, "hit_rate": hits / max(1, hits + misses)}


def drafting(model: Path, prompts: list[list[int]], max_tokens: int, runs: int) -> dict:
    """Acceptance per depth (fixed depth 3; a draft at depth i counts as accepted only with all before it)
    and decode tok/s with and without drafting, A/B alternated."""
    engine = Engine.load(model, EngineConfig(n_ctx=1024))
    arms = {"none": DraftConfig(), "mtp": DraftConfig(mode="mtp", depth=3, adaptive=False)}
    outputs: dict[str, list[list[int]]] = {}
    rates: dict[str, list[float]] = {name: [] for name in arms}
    for run in range(runs + 1):  # run 0 warms up and is not timed
        for name, draft in arms.items():
            tokens, decode_s = [], 0.0
            for prompt in prompts:
                engine.reset()
                gen = engine.generate(prompt, max_tokens, GREEDY, ignore_eos=True, draft=draft).run()
                tokens.append(gen.tokens)
                decode_s += gen.decode_s
            outputs[name] = tokens
            if run:  # the first token of each answer comes from prefill (MEASURING.md)
                rates[name].append(sum(max(len(t) - 1, 0) for t in tokens) / decode_s)
    stats = engine.draft_stats()
    drafted, accepted = stats["drafted_by_depth"], stats["accepted_by_depth"]
    return {"depth": 3, "prompts": len(prompts), "max_tokens": max_tokens, "runs": runs,
            "greedy_identical": outputs["none"] == outputs["mtp"],
            "acceptance_by_depth": [a / d if d else None for a, d in zip(accepted, drafted)],
            "drafted_by_depth": drafted, "accepted_by_depth": accepted,
            "tokens_per_verify": stats["tokens_per_verify"],
            "decode_tok_s": {name: {"median": statistics.median(r), "min": min(r), "max": max(r)} for name, r in rates.items()},
            "speedup_median": statistics.median(rates["mtp"]) / statistics.median(rates["none"])}


def chat_prompts(engine: Engine, corpus: Path, n: int) -> list[list[int]]:
    """The first question of the first n chats about held-out packages, in the model's chat template."""
    prompts = []
    for line in corpus.read_text().splitlines():
        doc = json.loads(line)
        if doc["kind"] == "chat":
            question = next(m for m in doc["messages"] if m["role"] == "user")
            prompts.append(engine.tokenizer.encode(engine.tokenizer.render_chat([question])))
        if len(prompts) == n:
            break
    return prompts


def environment(model: Path) -> dict:
    """The shared measurement environment, plus the model file, llama-cpp-python and the backend measured."""
    import llama_cpp

    return {**runner_environment(), "model_bytes": model.stat().st_size,
            "model_sha256": hashlib.sha256(model.read_bytes()).hexdigest(), "llama_cpp_python": llama_cpp.__version__,
            "backend": "numpy"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--data", type=Path, default=Path(".demo"), help="build_corpus.py's output folder")
    ap.add_argument("--train-eval", type=Path, help="eval.json of the training run, to compare with")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--slots", default="4,8,12", help="slot counts per layer (below the expert count)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    trained = json.loads(args.train_eval.read_text()) if args.train_eval else None
    test = np.load(args.data / "data" / "test.npy")
    seq = trained["test_fp32"]["window_tokens"] if trained else 1024
    slot_counts = [int(s) for s in args.slots.split(",")]
    t0 = time.time()
    engine = Engine.load(args.model, EngineConfig(n_ctx=seq))
    prompts = chat_prompts(engine, args.data / "corpus" / "test.jsonl", args.prompts)
    report = {"model": str(args.model), "environment": environment(args.model),
              "perplexity": perplexity(args.model, test, seq, args.windows, trained)}
    print(json.dumps({"perplexity": {k: v for k, v in report["perplexity"].items() if "window_loss" not in k}}), flush=True)
    report["llama_cpp"] = llama_parity(args.model, test[: min(seq, 256)].astype(int).tolist(), prompts[0], 32)
    print(json.dumps({"llama_cpp": report["llama_cpp"]}), flush=True)
    report["mtp"] = drafting(args.model, prompts, args.max_tokens, args.runs)
    print(json.dumps({"mtp": report["mtp"]}), flush=True)
    report["routing"] = decode_routing(args.model, prompts, args.max_tokens, slot_counts)
    for layer, figures in report["routing"]["layers"].items():
        print(json.dumps({"layer": layer, **{k: {kk: vv for kk, vv in v.items() if kk != "popularity_sorted"}
                                             for k, v in figures.items()}}), flush=True)
    print(json.dumps({"runner_cache": report["routing"]["runner_cache"]}), flush=True)
    report["eval_s"] = round(time.time() - t0, 1)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
