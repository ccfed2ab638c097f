"""MTP drafting's cost model on the CUDA backend (expert offload on by default); writes JSON.

Arms, alternated (none, oracle, mtp, none, ...) in one process after a discarded warm-up of each:
- `none`: plain greedy decoding; its time per token is the unit of the cost model.
- `oracle` (BENCHMARK-ONLY, labelled so in the JSON): the NextN block runs as usual, but its drafts
  are replaced by the main model's own greedy tokens, so every draft is accepted: the ceiling at
  acceptance 1.0, and verify batches of depth + 1 rows made of real tokens.
- `mtp`: the real NextN drafts (random weights: acceptance near 0).
- `forced{a}` (BENCHMARK-ONLY, with --accept): as oracle at --forced-depth, but each draft is the main
  model's token with probability a and a wrong one otherwise (seeded): acceptance a per position, to
  check the cost model's prediction end to end.
From the oracle arm at each fixed depth d: the cost of a verify batch of d + 1 rows and of one
draft step, in units of one decode step. With acceptance a per position, a step yields
1 + a + ... + a^d tokens for verify(d + 1) + d * draft time units, so
speedup(a, d) = (1 - a^(d+1)) / (1 - a) / (c_verify(d + 1) + d * c_draft); break-even where it is 1.
--routing locality-PRESET replaces the router's ids with calibrated synthetic ones (offload hit rates
like a real model's; labelled in the JSON), as bench_offload and runner profile do.

    python -m scripts.bench.bench_mtp MODEL --out mtp.json [--slots 40] [--context 1024] [--tokens 64]
    python -m scripts.bench.bench_mtp MODEL --slots 150 --routing locality-qwen3-30b-a3b --accept 0.5,0.7,0.9 --out f.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from runner.backends.budget import GIB
from runner.cli.progress import arena_progress
from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.offload.offload import OffloadConfig
from runner.offload.synthetic_routing import RoutingMode, attach, random_routing_record
from runner.spec.config import DraftConfig
from runner.spec.drafter import MTPDrafter
from scripts.bench.common import bench_ops, environment, summary

GREEDY = SamplingParams(temperature=0.0)


class OracleDrafter(MTPDrafter):
    """BENCHMARK-ONLY: runs the real NextN block, then replaces its drafts with `reference[i]` for
    generated position i (the main model's greedy continuation), so every draft is accepted; with
    `accept` < 1 each draft is that token with probability `accept` and a wrong one otherwise."""

    def __init__(self, engine: Engine, reference: list[int], prompt_len: int, accept: float = 1.0, seed: int = 0):
        super().__init__(engine.nextn[0], engine.n_ctx, engine._nextn_batch_rows())
        self.reference, self.prompt_len = reference, prompt_len
        self.accept, self.rng = accept, np.random.default_rng(seed)
        self.step_s: list[float] = []  # per draft step, over verify steps that caught up no prompt
        self.catch_up_s = 0.0  # the first draft's, when it fed the block the prompt's states (not the prefill phase)
        self.first = True

    def draft(self, token, depth, pick):
        t0 = time.perf_counter()
        real, _, caught_up = super().draft(token, depth, pick)
        if depth and caught_up <= depth + 1:  # else this call fed the prompt's states to the block
            self.step_s.append((time.perf_counter() - t0) / depth)
        elif depth and self.first:
            self.catch_up_s = time.perf_counter() - t0
        self.first = False
        first = len(self.tokens) + 1 - self.prompt_len
        n = self.block.cfg.n_vocab
        drafts = [self.reference[min(first + i, len(self.reference) - 1)] for i in range(len(real))]
        if self.accept < 1.0:  # a wrong draft: any other token
            drafts = [d if self.rng.random() < self.accept else (d + 1) % n for d in drafts]
        return drafts, [np.eye(1, n, d)[0] for d in drafts], caught_up


def timed(engine: Engine, prompt: list[int], n: int, draft: DraftConfig | None) -> tuple[list[int], float, dict]:
    """Greedy tokens, decode tok/s ((n - 1) / first-to-last token time) and the draft stats."""
    stamps: list[float] = []
    gen = engine.generate(prompt, n, GREEDY, ignore_eos=True, draft=draft)
    for step in gen.steps():
        if step.token is not None:
            stamps.append(time.perf_counter())
    stats = gen.draft.to_dict() if gen.draft is not None else {}
    return gen.tokens, (len(gen.tokens) - 1) / (stamps[-1] - stamps[0]), stats


def speedup(a: float, depth: int, c_verify: float, c_draft: float) -> float:
    tokens = depth + 1 if a >= 1.0 else (1 - a ** (depth + 1)) / (1 - a)
    return tokens / (c_verify + depth * c_draft)


def break_even(depth: int, c_verify: float, c_draft: float) -> float | None:
    """The acceptance at which drafting to `depth` starts to pay (None: not even at acceptance 1)."""
    if speedup(1.0, depth, c_verify, c_draft) < 1.0:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if speedup(mid, depth, c_verify, c_draft) >= 1.0 else (mid, hi)
    return hi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit", default=None, help="default: the checkout's (git rev-parse HEAD)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--slots", default="40", help="cache slots per layer, auto, or 'resident' (no offload)")
    ap.add_argument("--vram-budget", type=float, default=24.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="cuda", choices=["cuda", "numpy"], help="numpy: a dry run on the CPU")
    ap.add_argument("--routing", default="random", help="random (the file's router), uniform, or locality-PRESET")
    ap.add_argument("--accept", default="", help="forced acceptance rates to run end to end, e.g. 0.5,0.7,0.9")
    ap.add_argument("--forced-depth", type=int, default=3, choices=[1, 2, 3])
    args = ap.parse_args()
    forced = [float(a) for a in args.accept.split(",") if a]
    if any(not 0.0 <= a <= 1.0 for a in forced):
        ap.error("--accept: rates between 0 and 1")

    offload = None
    if args.slots != "resident":
        slots = args.slots if args.slots == "auto" else int(args.slots)
        offload = OffloadConfig(cache_slots=slots, prefill_ubatch=2048, decode_batch=4, transaction="always",
                                vram_budget_bytes=int(args.vram_budget * GIB))
    n_ctx = args.context + args.tokens + 16
    with arena_progress() as progress:  # a bar on a terminal's stderr; the JSON out stays clean
        engine = Engine.load(args.model, EngineConfig(n_ctx=n_ctx, ubatch=512, offload=offload),
                             ops=bench_ops(args.backend, args.vram_budget), arena_progress=progress)
    if engine.n_ctx < n_ctx:  # the model's own context caps it (the demo model's is 1024)
        raise SystemExit(f"bench_mtp: --context {args.context} + --tokens {args.tokens} (+16) needs {n_ctx} positions; "
                         f"this model holds {engine.n_ctx}")
    routing = attach(engine, RoutingMode.parse(args.routing))
    rng = np.random.default_rng(args.seed)
    vocab = engine.model_config.n_vocab
    arms = ["none", *(f"oracle{d}" for d in (1, 2, 3)), "mtp3", *(f"forced{a}" for a in forced)]
    results: dict[str, dict[str, list]] = {arm: {"tok_s": [], "verify_s": [], "draft_s": [], "acceptance": [],
                                                 "catch_up_s": []}
                                           for arm in arms}
    for run in range(args.runs + 1):  # run 0 is the warm-up
        prompt = rng.integers(0, vocab, size=args.context).tolist()  # unique per run
        engine.reset()
        reference, tok_s, _ = timed(engine, prompt, args.tokens, None)
        if run:
            results["none"]["tok_s"].append(tok_s)
        for arm in arms[1:]:
            depth = args.forced_depth if arm.startswith("forced") else int(arm[-1])
            accept = float(arm.removeprefix("forced")) if arm.startswith("forced") else 1.0
            engine.reset()
            oracle = OracleDrafter(engine, reference, len(prompt), accept, seed=run) if arm.startswith(
                ("oracle", "forced")) else None
            engine.drafter = oracle
            tokens, tok_s, st = timed(engine, prompt, args.tokens, DraftConfig("mtp", depth, adaptive=False))
            assert tokens == reference, f"{arm}: drafting changed the greedy output"
            if run:
                r = results[arm]
                r["tok_s"].append(tok_s)
                r["verify_s"].append(st["verify_s"] / st["verify_steps"])
                if oracle is not None:
                    r["draft_s"].append(statistics.median(oracle.step_s))
                    r["catch_up_s"].append(oracle.catch_up_s)
                r["acceptance"].append(st["draft_acceptance"])
        engine.drafter = None

    decode_s = 1.0 / statistics.median(results["none"]["tok_s"])
    model = {}
    for depth in (1, 2, 3):
        r = results[f"oracle{depth}"]
        c_verify = statistics.median(r["verify_s"]) / decode_s
        c_draft = statistics.median(r["draft_s"]) / decode_s
        model[str(depth)] = {
            "verify_rows": depth + 1, "verify_cost_in_decode_steps": c_verify, "draft_step_cost_in_decode_steps": c_draft,
            "break_even_acceptance": break_even(depth, c_verify, c_draft),
            "speedup_by_acceptance": {f"{a:.1f}": speedup(a, depth, c_verify, c_draft) for a in np.linspace(0, 1, 11)},
            "oracle_end_to_end_speedup": statistics.median(r["tok_s"]) / statistics.median(results["none"]["tok_s"])}
    c = model[str(args.forced_depth)]
    # the cost model's a is per position (a draft is accepted when every one before it was); the engine's
    # acceptance counts accepted drafts over drafted ones, so it reads lower than a at depth > 1
    checks = {arm: {"per_position_acceptance": a, "drafts_accepted_share": statistics.median(results[arm]["acceptance"]),
                    "end_to_end_speedup": statistics.median(results[arm]["tok_s"]) / statistics.median(
                        results["none"]["tok_s"]),
                    "predicted_speedup": speedup(a, args.forced_depth, c["verify_cost_in_decode_steps"],
                                                 c["draft_step_cost_in_decode_steps"])}
              for arm, a in ((f"forced{a}", a) for a in forced)}
    record = {"benchmark": "mtp_cost_model", "model": args.model.name, "environment": environment(args.commit, vars(args)),
              "offload": None if offload is None else {"slots_per_layer": engine.offload.cache.slots_per_layer},
              "context": args.context, "tokens": args.tokens, "decode_s_per_token": decode_s,
              "note": "oracle arms are benchmark-only: drafts replaced by the main model's own greedy tokens",
              "arms": {arm: {k: summary(v) for k, v in r.items() if v and None not in v} for arm, r in results.items()},
              "cost_model": model, "forced_acceptance": {"depth": args.forced_depth, "arms": checks},
              "routing": routing.record() if routing is not None else random_routing_record(),
              "engine_stats": engine.stats()}
    args.out.write_text(json.dumps(record, indent=2, default=str))
    print(json.dumps({"decode_s": decode_s, "cost_model": {d: {k: v for k, v in m.items() if k != "speedup_by_acceptance"}
                                                           for d, m in model.items()}, "forced": checks}))


if __name__ == "__main__":
    main()
