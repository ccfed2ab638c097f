"""scripts/bench_prefetch_routing.py: its spelled-out decode is the engine's, and its cache replay counts right."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from runner.cli_support import DEMO_MODEL
from runner.engine import Engine, EngineConfig
from runner.sampling import SamplingParams

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _script():
    spec = importlib.util.spec_from_file_location("bench_prefetch_routing", SCRIPTS / "bench_prefetch_routing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_traced_decode_gives_the_engines_greedy_tokens() -> None:
    bench = _script()
    engine = Engine.load(DEMO_MODEL, EngineConfig(n_ctx=256))
    prompt = engine.tokenizer.encode(engine.tokenizer.render_chat([{"role": "user", "content": "What does curl do?"}]))
    steps, decoded = bench.trace(engine, [prompt], 12)
    want = Engine.load(DEMO_MODEL, EngineConfig(n_ctx=256)).generate(
        prompt, 12, SamplingParams(temperature=0.0), ignore_eos=True).run().tokens
    assert decoded[0] == want
    assert len(steps) == 11 and all(len(routed) == engine.model_config.n_expert_used for routed, _ in steps[0].values())


def test_replay_counts_hits_misses_and_wasted_prefetches() -> None:
    bench = _script()
    # One layer, 2 slots: token 1 routes [0, 1] (predicted [0, 2]); token 2 routes [2, 3] (predicted [2, 3]).
    steps = [{1: ([0, 1], [0, 2])}, {1: ([2, 3], [2, 3])}]
    plain = bench.replay(steps, 2, prefetch=False)
    assert plain["hit_rate"] == 0.0 and plain["misses_per_token"] == 2.0
    early = bench.replay(steps, 2, prefetch=True)
    # Token 1: prefetch 0 and 2 (2 uploads, 2 is wasted), then 0 hits, 1 misses (evicts 2).
    # Token 2: prefetch 2 and 3 (2 uploads, none wasted), then both hit.
    assert early["prefetch_uploads_per_token"] == 2.0 and early["wasted_per_token"] == 0.5
    assert early["hit_rate"] == 0.75 and early["misses_per_token"] == 0.5 and early["uploads_per_token"] == 2.5
