"""bench_agent_trace against `runner serve` on the demo model with a prompt cache (no timings asserted):
every request of the seeded interleaved trace is in the JSON with the trace itself, each conversation's
prompt grows by reusing the previous one, and switching back to a conversation restores its prompt."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

from test_server_harness import serve_model

from runner.engine.engine import Engine, EngineConfig
from runner.package_data import demo_model_path
from scripts.bench.bench_agent_trace import build_trace

ROOT = Path(__file__).resolve().parent.parent


def test_the_trace_is_seeded_and_each_turn_extends_the_previous_prompt() -> None:
    trace = build_trace(5, conversations=3, turns=3, system_words=600, growth=0.05)
    assert trace == build_trace(5, conversations=3, turns=3, system_words=600, growth=0.05)
    assert [(t["conversation"], t["turn"]) for t in trace[:4]] == [(0, 0), (1, 0), (2, 0), (0, 1)]
    for prev, cur in zip(trace, trace[3:]):
        assert cur["messages"][:len(prev["messages"])] == prev["messages"]
        assert len(cur["messages"]) == len(prev["messages"]) + 2
        chars = [sum(len(m["content"]) for m in t["messages"]) for t in (prev, cur)]
        assert 1.04 < chars[1] / chars[0] < 1.07  # about 95% of each prompt is the previous one


def test_agent_trace_records_every_request_and_the_reuse_across_switches(tmp_path) -> None:
    demo = demo_model_path()
    out = tmp_path / "trace.json"
    engine = Engine.load(demo, EngineConfig(n_ctx=1024, prompt_cache_bytes=1 << 30))
    with serve_model(demo, engine=engine) as (url, _):
        done = subprocess.run([sys.executable, "-m", "scripts.bench.bench_agent_trace", "--url", url,
                               "--conversations", "3", "--turns", "3", "--system-words", "120", "--gen", "4",
                               "--seed", "2", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    r = json.loads(out.read_text())
    runs = r["runs"]
    assert len(runs) == len(r["trace"]) == 9
    assert r["warmups_discarded"] == 1 and r["reuse_fields"] == [
        "timings.cache_restored_n", "usage.prompt_tokens_details.cached_tokens"]
    assert r["trace"] == build_trace(2, 3, 3, 120, 0.05)  # the exact prompts, to replay against llama-server
    assert [(x["conversation"], x["turn"]) for x in runs] == [(t["conversation"], t["turn"]) for t in r["trace"]]
    for x in runs:
        assert x["completion_tokens"] == 4 and x["cached_source"] == "usage.prompt_tokens_details.cached_tokens"
        assert x["cached_tokens"] == x["timings_cache_n"] and x["client"]["ttft_s"] > 0
    for c in range(3):
        conv = [x for x in runs if x["conversation"] == c]
        assert conv[0]["cached_tokens"] < conv[0]["prompt_tokens"] // 2  # cold: at most the template's head
        for prev, cur in itertools.pairwise(conv):
            # Another conversation ran in between: its prompt came back from host RAM, not re-prefilled.
            assert cur["restored_tokens"] > 0 and cur["cached_tokens"] >= cur["restored_tokens"]
            assert cur["cached_tokens"] > prev["cached_tokens"]
            assert cur["cached_tokens"] >= 0.8 * prev["prompt_tokens"]
    s = r["summary"]
    assert s["overall"]["prompt_tokens"]["n"] == 9 and set(s["per_turn"]) == {"0", "1", "2"}
    assert s["per_turn"]["2"]["reused_share"]["min"] > 0.8 and s["per_turn"]["0"]["reused_share"]["max"] < 0.5
