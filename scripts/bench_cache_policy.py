"""Slot cache eviction policies on the trained demo model: decode hit rate and miss bytes per policy and slot count.

Hit rates depend on routing, not on the backend, so this runs on the numpy backend with the demo
model's real (trained) routing; random-weight models have none to measure. Writes JSON.

    python scripts/bench_cache_policy.py runner/data/demo.gguf --data .demo --out policies.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_demo import GREEDY, environment, routing_bench_setup  # noqa: E402

from runner.engine.engine import Engine, EngineConfig  # noqa: E402
from runner.offload.offload import OffloadConfig  # noqa: E402
from runner.offload.policies import POLICIES  # noqa: E402


def decode_counts(model: Path, prompts: list[list[int]], max_tokens: int, slots: int, policy: str) -> dict:
    """Cache counters over the decode steps only (each prompt streamed first, with warm restore)."""
    engine = Engine.load(model, EngineConfig(n_ctx=1024, offload=OffloadConfig(cache_slots=slots, cache_policy=policy)))
    hits = misses = nbytes = tokens = 0
    for prompt in prompts:
        before = None
        for step in engine.generate(prompt, max_tokens, GREEDY, ignore_eos=True).steps():
            before = before or dict(engine.stats()["cache"]["total"])
            tokens += step.token is not None
        after = engine.stats()["cache"]["total"]
        hits += after["hits"] - before["hits"]
        misses += after["misses"] - before["misses"]
        nbytes += after["bytes_uploaded"] - before["bytes_uploaded"]
    return {"hits": hits, "misses": misses, "hit_rate": hits / max(1, hits + misses),
            "miss_bytes_per_token": nbytes / max(1, tokens)}


def main() -> None:
    args, _, prompts, slot_counts = routing_bench_setup(__doc__)
    result = {policy: {s: decode_counts(args.model, prompts, args.max_tokens, s, policy) for s in slot_counts}
              for policy in POLICIES}
    report = {"benchmark": "cache_policy", "model": args.model.name, "environment": environment(args.model),
              "prompts": len(prompts), "max_tokens": args.max_tokens, "policies": result}
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
