"""scripts/bench_prefetch_routing.py: its spelled-out decode is the engine's, and its cache replay counts right."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from runner.cli.support import default_model_path
from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _script():
    spec = importlib.util.spec_from_file_location("bench_prefetch_routing", SCRIPTS / "bench_prefetch_routing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_traced_decode_gives_the_engines_greedy_tokens() -> None:
    bench = _script()
    engine = Engine.load(default_model_path(), EngineConfig(n_ctx=256))
    prompt = engine.tokenizer.encode(engine.tokenizer.render_chat([{"role": "user", "content": "What does curl do?"}]))
    steps, decoded = bench.trace(engine, [prompt], 12)
    want = Engine.load(default_model_path(), EngineConfig(n_ctx=256)).generate(
        prompt, 12, SamplingParams(temperature=0.0), ignore_eos=True).run().tokens
    assert decoded[0] == want
    k, moe = engine.model_config.n_expert_used, sorted(steps[0])
    assert len(steps) == 11 and all(len(routed) == len(early) == k for routed, early, _ in steps[0].values())
    assert all(step[moe[0]][2] == [] and all(len(step[i][2]) == k for i in moe[1:]) for step in steps)


def test_replay_counts_hits_misses_and_wasted_prefetches() -> None:
    bench = _script()
    # One layer, 2 slots: token 1 routes [0, 1] (predicted early [0, 2]); token 2 routes [2, 3] (early [2, 3]).
    # Ahead: nothing predicted at token 1 (as for a first MoE layer), [3, 0] at token 2.
    steps = [{1: ([0, 1], [0, 2], [])}, {1: ([2, 3], [2, 3], [3, 0])}]
    plain = bench.replay(steps, 2, None)
    assert plain["hit_rate"] == 0.0 and plain["misses_per_token"] == 2.0
    early = bench.replay(steps, 2, "early")
    # Token 1: prefetch 0 and 2 (2 uploads, 2 is wasted), then 0 hits, 1 misses (evicts 2).
    # Token 2: prefetch 2 and 3 (2 uploads, none wasted), then both hit.
    assert early["prefetch_uploads_per_token"] == 2.0 and early["wasted_per_token"] == 0.5
    assert early["hit_rate"] == 0.75 and early["misses_per_token"] == 0.5 and early["uploads_per_token"] == 2.5
    # Token 1 as without prefetch (0 and 1 miss). Token 2: prefetch 3 (evicts 0), then 0 (evicts 1; wasted,
    # 2 uploads); 2 misses and evicts 3, the older prediction, which then misses too (evicts 0).
    ahead = bench.replay(steps, 2, "ahead")
    assert ahead["prefetch_uploads_per_token"] == 1.0 and ahead["wasted_per_token"] == 0.5
    assert ahead["hit_rate"] == 0.0 and ahead["misses_per_token"] == 2.0 and ahead["uploads_per_token"] == 3.0
