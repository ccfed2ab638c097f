"""Screen decode knobs in one process: resident decode's GPU time a token under each arm, arms alternated; JSON.

Each arm sets module or class constants that the decode kernels read when a graph is captured
(`--arm NAME=PATH=VALUE[,PATH=VALUE...]`, PATH dotted from the package: gemv.ROUTE_WARP_COLUMNS, ...). The
model loads once; every round runs the baseline (no settings) and then each arm, each after its graphs were
dropped and recaptured, and every constant comes back before the next arm. So many arms and rounds fit a short
device call, and an arm is compared with the baseline of its own process and round. A screen, not a claim:
shared/MEASURING.md's fresh processes (scripts/bench/h2h_llama.py) decide. Every arm decodes the same tokens
from the same context, and the knobs keep bits, so the record says whether each arm's tokens were the baseline's.

    python -m scripts.bench.decode_arms_cuda MODEL.gguf --context 1024 --tokens 32 --rounds 5 \\
        --arm route18=runner.backends.cuda.gemv.ROUTE_WARP_COLUMNS=1,runner.backends.cuda.gemv.ROUTE_LOAD_AHEAD=8 \\
        --out arms.json
    python -m scripts.bench.decode_arms_cuda runner/data/demo.gguf --backend numpy --context 64 --tokens 4 \
        --rounds 1 --arm half=runner.backends.cuda.gemv.EXPERT_HALF_SLICES=True --out dry.json  # the CPU dry run
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import json
import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

BASELINE = "main"


class ArmError(ValueError):
    pass


def parse_arm(text: str) -> tuple[str, list[tuple[str, Any]]]:
    """NAME=PATH=VALUE[,PATH=VALUE...] -> (NAME, [(PATH, value)]); values are Python literals (1, True, None)."""
    name, sep, rest = text.partition("=")
    if not sep or not name or name == BASELINE:
        raise ArmError(f"an arm is NAME=PATH=VALUE[,PATH=VALUE...] with a name other than '{BASELINE}', got {text!r}")
    settings = []
    for item in rest.split(","):
        path, sep, value = item.partition("=")
        if not sep or "." not in path:
            raise ArmError(f"arm {name}: {item!r} is not a dotted PATH=VALUE")
        try:
            settings.append((path.strip(), ast.literal_eval(value.strip())))
        except (ValueError, SyntaxError):
            raise ArmError(f"arm {name}: {value!r} is not a Python literal") from None
    return name, settings


def resolve(path: str) -> tuple[Any, str]:
    """(owner, attribute) of a dotted PATH: the longest importable module prefix, then attributes to the owner.
    The attribute must exist: a misspelt knob would otherwise be set and never read."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:-1]:
            owner = getattr(owner, part)
        if not hasattr(owner, parts[-1]):
            raise ArmError(f"{path}: {owner.__name__} has no {parts[-1]}")
        return owner, parts[-1]
    raise ArmError(f"{path}: no module to import")


@contextmanager
def applied(settings: list[tuple[str, Any]]) -> Iterator[None]:
    """The settings while the block runs; every constant as it was afterwards, whatever happened."""
    saved = []
    try:
        for path, value in settings:
            owner, attr = resolve(path)
            saved.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, value)
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)


def decode(model: Any, kv: Any, context: int, n_tokens: int, first: int) -> tuple[list[int], list[float]]:
    """Greedy tokens from `first` at `context` (graphs dropped first, so they are captured under the arm's
    constants: 3 warm-up steps), and each timed replay's GPU milliseconds (a backend without graphs, the numpy
    dry run: each step's wall milliseconds)."""
    import numpy as np

    ops = model.ops
    graphs = hasattr(ops, "invalidate_graphs")
    if graphs:
        ops.invalidate_graphs()
    kv.truncate(context)
    token = first
    for _ in range(3):
        logits, _ = ops.decode_forward(model, token, kv)
        token = int(np.argmax(ops.to_host(logits)[-1]))
    kv.truncate(context)
    token, tokens, walls = first, [], []
    if graphs:
        ops.replay_times_ms = []
    for _ in range(n_tokens):
        t0 = time.perf_counter()
        logits, _ = ops.decode_forward(model, token, kv)
        token = int(np.argmax(ops.to_host(logits)[-1]))
        walls.append((time.perf_counter() - t0) * 1e3)
        tokens.append(token)
    if not graphs:
        return tokens, walls
    ops.decode_graph(kv).collect_times()  # the last replay's too (each token's download waited for it)
    times, ops.replay_times_ms = list(ops.replay_times_ms), None
    return tokens, times


def arm_summaries(arms: list[tuple[str, list[tuple[str, Any]]]], per_round: dict[str, list[float]],
                  digests: dict[str, set[str]]) -> dict[str, Any]:
    from scripts.bench.common import summary

    base = per_round[BASELINE]
    return {name: {"settings": {p: v for p, v in settings},
                   "ms_per_token": summary(per_round[name]),
                   "ratio_to_main_by_round": [a / b for a, b in zip(per_round[name], base)],
                   "same_tokens_as_main": digests[name] == digests[BASELINE] and len(digests[name]) == 1}
            for name, settings in arms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arm", action="append", default=[], help="NAME=PATH=VALUE[,PATH=VALUE...] (repeatable)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--commit", default=None, help="default: the checkout's (git rev-parse HEAD)")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "numpy"], help="numpy: a dry run on the CPU")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1 (round 0, the compiles, is discarded)")
    arms = [(BASELINE, [])] + [parse_arm(a) for a in args.arm]
    for _, settings in arms:
        for path, _ in settings:
            resolve(path)  # every path checked before the model loads

    import numpy as np

    from runner.gguf_file import open_gguf
    from runner.models import MoETransformer
    from runner.models.config import model_config
    from runner.models.weights import load_weights
    from scripts.bench.common import bench_ops, environment

    t0 = time.perf_counter()
    f = open_gguf(args.model)
    cfg = model_config(f)
    weights = load_weights(f, cfg)
    ops = bench_ops(args.backend, None)  # every weight resident: the device's free memory
    ops.check_weights(weights.all_tensors())
    model = MoETransformer(cfg, weights, ops)
    kv = model.new_kv_cache(args.context + args.tokens + 8)
    fill = np.random.default_rng(0).integers(0, cfg.n_vocab, size=args.context)
    for start in range(0, args.context, 2048):
        model.forward(fill[start : min(args.context, start + 2048)], kv)
    load_s = time.perf_counter() - t0
    first = int(fill[-1])

    per_round: dict[str, list[float]] = {name: [] for name, _ in arms}
    digests: dict[str, set[str]] = {name: set() for name, _ in arms}
    meta = {"benchmark": "decode_arms_cuda", "backend": args.backend, "environment": environment(args.commit, vars(args)),
            "measure": "graph GPU ms a token" if args.backend == "cuda" else "wall ms a step (dry run)",
            "model": args.model.name, "n_layer": cfg.n_layer, "load_s": load_s, "context": args.context,
            "tokens": args.tokens}
    for r in range(args.rounds + 1):  # round 0 compiles every arm's modules: discarded
        for name, settings in arms:
            with applied(settings):
                tokens, times = decode(model, kv, args.context, args.tokens, first)
            if r:
                per_round[name].append(statistics.median(times))
                digests[name].add(hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest())
        if r:  # written every round: a call's deadline that cuts the screen short keeps the rounds done
            record = {**meta, "rounds": r, "arms": arm_summaries(arms, per_round, digests)}
            args.out.write_text(json.dumps(record, indent=2))
    print(json.dumps({name: (round(arm["ms_per_token"]["median"], 4), arm["same_tokens_as_main"])
                      for name, arm in record["arms"].items()}))


if __name__ == "__main__":
    main()
