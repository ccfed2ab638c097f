"""A seeded routing process with temporal locality, calibrated to measured LRU hit rates (benchmarks only).

A synthetic file's random router does not route like a trained one: it favours some experts for every
token and reuses little from one token to the next (docs/perf/2026-12-04-routing-locality.md), so
full-shape cache figures on such files say little about a real model. This process stands in for a
trained router (runner/offload/synthetic_routing.py swaps its ids in).

The process, per MoE layer and position: each expert e weighs

    w_e = exp(-(age_e - 1) / tau) + novelty * pop_e

where age_e is how many positions ago the layer last routed to e (infinite if never) and pop_e a
Zipf(s) popularity over a seeded per-layer ranking of the experts, scaled to mean 1. The position
takes k distinct experts by successive sampling without replacement in proportion to w (Gumbel top-k).
An expert just used weighs about 1, one used tau positions ago about 1/e, the rest `novelty` times
their popularity: tau sets how far back reuse reaches, novelty how often a new expert comes in, s how
uneven the newcomers are. Three numbers, fitted by `calibrate`.

Calibration targets are LRU hit rates measured from a cold cache over a run of `tokens` decoded
tokens; `calibrate` simulates the same (the project's own LRU policy, policies.py, serving each token
as the slot cache does) and fits the three numbers by least squares over the targets.

- `qwen3-30b-a3b`: the published figures for Qwen3-30B-A3B (128 experts, top-8, 48 layers), imp
  (github.com/kekzl/imp) PR #1374: 24 / 73 / 146 / 244 slots per layer give 36.6 / 74.1 / 89.4 / 96.2%
  hits over 256 cold decode tokens. 146 and 244 are more than the 128 experts a layer has: in imp a
  slot holds one of an expert's three matrices (gate, up, down; the PR calls 24 = 3 x top_k the size
  that "barely holds a single token"), so the figures are 8, 24, 49 and 81 experts per layer (slots / 3,
  rounded), 6 / 19 / 38 / 63% of the layer's experts. That is the reading used here. imp's own notes
  (PR #2061) say its bench generates on a repetitive synthetic prompt, so these figures are likely
  above what diverse text gives: treat this preset as the optimistic one.
- `demo`: the trained demo model (runner/data/demo.gguf, 16 experts, top-2), measured on the CPU by
  scripts/bench/demo_routing.py (docs/perf/2026-12-04-routing-locality/demo_routing.json).

A shape other than the target's is calibrated at the same slots as a fraction of its n_expert
(slots = round(fraction * n_expert), at least k) over a run with as many uses per expert
(tokens * k / n_expert): the hit-rate curve over the fraction of a layer's experts held is what
carries over, not the slot count.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from runner.errors import RunnerError
from runner.offload.policies import POLICIES


class RoutingError(RunnerError):
    """A synthetic routing preset, shape or lookup that cannot be honoured."""


@dataclass(frozen=True)
class LocalityProcess:
    tau: float  # positions over which an expert's recency weight falls by 1/e
    novelty: float  # weight of an expert not used lately, relative to one used at the last position
    zipf_s: float  # unevenness of the newcomers' popularity (0: uniform)
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.tau > 0 and self.novelty > 0 and self.zipf_s >= 0):
            raise RoutingError(f"locality process needs tau > 0, novelty > 0, zipf_s >= 0; got {self}")

    def generate(self, n_expert: int, k: int, n_positions: int, n_layers: int) -> np.ndarray:
        """int32 [n_layers, n_positions, k]: each position's k distinct experts, per layer (seeded, deterministic)."""
        if not 1 <= k <= n_expert:
            raise RoutingError(f"top-{k} of {n_expert} experts")
        rng = np.random.default_rng(self.seed)
        ranks = rng.permuted(np.tile(np.arange(n_expert), (n_layers, 1)), axis=1)  # [L, E] each expert's rank
        pop = (1.0 + ranks) ** -self.zipf_s
        pop *= n_expert / pop.sum(axis=1, keepdims=True)  # mean 1, so novelty means the same at every s
        base = self.novelty * pop
        last = np.full((n_layers, n_expert), -np.inf)  # position of each expert's last use
        rows = np.arange(n_layers)[:, None]
        out = np.empty((n_layers, n_positions, k), dtype=np.int32)
        for p in range(n_positions):
            weight = np.exp((last - (p - 1)) / self.tau) + base  # [L, E]; exp(-inf) = 0 for never used
            score = np.log(weight) - np.log(-np.log(rng.random((n_layers, n_expert))))  # + Gumbel noise
            top = np.argpartition(-score, k - 1, axis=1)[:, :k]
            top = np.take_along_axis(top, np.argsort(-np.take_along_axis(score, top, 1), 1), 1)  # best first
            out[:, p] = top
            last[rows, top] = p
        return out


def lru_hit_rate(ids: np.ndarray, slots: int, n_expert: int, policy: str = "lru", count_from: int = 0) -> float:
    """Hits / lookups of one layer's cache of `slots` (empty at the start) serving ids [T, k] token by token,
    counted from token `count_from` on (the tokens before only warm the cache).

    Each token is served as ExpertSlotCache._serve serves it: the policy (policies.py) is touched on
    hits and fills, and a miss evicts the policy's victim outside the token's own experts."""
    if slots < ids.shape[1]:
        raise RoutingError(f"{slots} slots cannot serve a token of {ids.shape[1]} experts")
    chooser = POLICIES[policy](slots, n_expert)
    held: set[int] = set()
    hits = misses = 0
    for t, row in enumerate(np.asarray(ids).tolist()):
        wanted = list(dict.fromkeys(row))
        counted = t >= count_from
        for e in reversed(wanted):  # oldest first, as _serve does
            if e in held:
                hits += counted
            else:
                misses += counted
                if len(held) >= slots:
                    victim = chooser.victim(set(wanted))
                    held.discard(victim)
                    chooser.forget(victim)
                held.add(e)
            chooser.touch(e)
    return hits / max(1, hits + misses)


@dataclass(frozen=True)
class CalibrationTarget:
    """LRU hit rates measured at slot counts on one shape, from a cold cache over `tokens` decoded tokens."""

    name: str
    source: str
    n_expert: int
    k: int
    tokens: int
    points: tuple[tuple[int, float], ...]  # (slots per layer, hit rate)

    def scaled_points(self, n_expert: int, k: int) -> tuple[tuple[int, float], ...]:
        """The points at the same fraction of the experts on another shape (at least k slots)."""
        return tuple((max(k, round(s / self.n_expert * n_expert)), h) for s, h in self.points)

    def scaled_tokens(self, n_expert: int, k: int) -> int:
        """The run length with as many uses per expert (tokens * k / n_expert): a cold cache then fills in
        the same share of the run, so the compulsory misses weigh the same."""
        return max(1, round(self.tokens * self.k / self.n_expert * n_expert / k))


PRESETS: dict[str, CalibrationTarget] = {
    "qwen3-30b-a3b": CalibrationTarget(
        "qwen3-30b-a3b", "kekzl/imp PR #1374: 24/73/146/244 matrix slots (8/24/49/81 experts) per layer, "
        "256 cold decode tokens, Qwen3-30B-A3B Q4_K_M", n_expert=128, k=8, tokens=256,
        points=((8, 0.366), (24, 0.741), (49, 0.894), (81, 0.962))),
    "demo": CalibrationTarget(
        "demo", "runner/data/demo.gguf, 4 MoE layers, greedy answers of 96 decode tokens to 12 chat "
        "prompts, numpy backend (scripts/bench/demo_routing.py)", n_expert=16, k=2, tokens=96,
        points=((2, 0.283), (4, 0.448), (8, 0.699), (12, 0.845))),  # mean over layers; random routing: .12/.24/.48/.71
}


@dataclass(frozen=True)
class Calibration:
    target: str
    n_expert: int
    k: int
    tokens: int  # the simulated run: cold cache over this many positions
    process: LocalityProcess
    points: tuple[tuple[int, float, float], ...]  # (slots, target hit rate, the process's simulated hit rate)

    @property
    def max_error(self) -> float:
        return max(abs(got - want) for _, want, got in self.points)

    def to_dict(self) -> dict:
        return {"target": self.target, "source": PRESETS[self.target].source, "n_expert": self.n_expert, "k": self.k,
                "simulated_tokens": self.tokens, "tau": self.process.tau, "novelty": self.process.novelty, "zipf_s": self.process.zipf_s,
                "seed": self.process.seed, "max_abs_error": self.max_error,
                "points": [{"slots": s, "target_hit_rate": want, "simulated_hit_rate": got}
                           for s, want, got in self.points]}


def simulated_hit_rates(process: LocalityProcess, n_expert: int, k: int, tokens: int,
                        slot_counts: list[int]) -> list[float]:
    """Mean over simulated layers of the cold LRU hit rate over `tokens` positions, per slot count; enough
    layers for about 16k expert uses, at least 4."""
    layers = max(4, round(16384 / (tokens * k)))
    ids = process.generate(n_expert, k, tokens, layers)
    return [float(np.mean([lru_hit_rate(ids[i], s, n_expert) for i in range(layers)])) for s in slot_counts]


@functools.lru_cache(maxsize=16)
def calibrate(preset: str, n_expert: int, k: int, seed: int = 0) -> Calibration:
    """Fit (tau, novelty, zipf_s) so the process's simulated LRU hit rates meet the preset's at the same
    fraction of n_expert; deterministic (one seed for every trial, so the fit compares like with like)."""
    if preset not in PRESETS:
        raise RoutingError(f"unknown routing preset '{preset}'; choose from {', '.join(PRESETS)}")
    target = PRESETS[preset]
    points, tokens = target.scaled_points(n_expert, k), target.scaled_tokens(n_expert, k)
    slots = [s for s, _ in points]
    want = np.array([h for _, h in points])

    def error(x: tuple[float, float, float]) -> float:
        got = simulated_hit_rates(LocalityProcess(np.exp(x[0]), np.exp(x[1]), x[2], seed), n_expert, k, tokens, slots)
        return float(np.sum((np.array(got) - want) ** 2))

    # a coarse grid, then a pattern search in (log tau, log novelty, s) with halving steps
    grid = [(np.log(t), np.log(n), s) for t in (1.5, 3.0, 6.0) for n in (0.01, 0.03, 0.1) for s in (0.0, 0.6, 1.2)]
    best = min(grid, key=error)
    best_err, step = error(best), np.array([0.35, 0.5, 0.3])
    for _ in range(4):
        improved = True
        while improved:
            improved = False
            for d in range(3):
                for sign in (1, -1):
                    x = tuple(np.array(best) + sign * step * np.eye(3)[d])
                    if x[2] < 0:
                        continue
                    e = error(x)
                    if e < best_err:
                        best, best_err, improved = x, e, True
        step = step / 2
    process = LocalityProcess(float(np.exp(best[0])), float(np.exp(best[1])), float(best[2]), seed)
    got = simulated_hit_rates(process, n_expert, k, tokens, slots)
    return Calibration(preset, n_expert, k, tokens, process, tuple((s, h, g) for (s, h), g in zip(points, got)))
