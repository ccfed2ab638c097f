"""Draft statistics where users see them: `runner generate --draft`, the server's timings and
metrics, the chat summary line, and the engine's stats accessor."""

from __future__ import annotations

import json

from click.testing import CliRunner

from runner.cli.chat import summary
from runner.cli.chat_session import TurnStats
from runner.cli.main import main
from runner.engine.engine import Engine, EngineConfig
from runner.engine.generation import Generation
from runner.engine.sampling import SamplingParams
from runner.server.formats import timings
from runner.server.metrics import Metrics
from runner.spec.config import DraftConfig
from runner.spec.stats import DraftStats


def _generate(*args: str):
    return CliRunner().invoke(main, ["generate", *args, "--backend", "numpy"])


def test_generate_with_mtp_drafts_prints_the_same_tokens_and_the_draft_figures(synth_model) -> None:
    path = str(synth_model("glm4moe", "F32", seed=41))
    common = ["-p", "Once upon a time", "-n", "30", "--temperature", "0", "--ignore-eos", "--json"]
    plain = json.loads(_generate(path, *common).output)
    drafted = _generate(path, *common, "--draft", "mtp", "--draft-depth", "2", "--draft-fixed")
    assert drafted.exit_code == 0, drafted.output
    result = json.loads(drafted.output)
    assert result["tokens"] == plain["tokens"]
    assert "drafted_n" not in plain
    assert result["drafted_n"] == sum(result["drafted_by_depth"]) > 0
    assert len(result["draft_acceptance_by_depth"]) == 3 and result["tokens_per_verify"] >= 1.0


def test_generate_summary_line_reports_drafts(synth_model) -> None:
    out = _generate(str(synth_model("glm4moe", "F32", seed=41)), "-p", "Hi", "-n", "8", "--draft", "mtp")
    assert out.exit_code == 0, out.output
    assert "drafted" in out.output and "tok/verify" in out.output and "by depth" in out.output


def test_draft_mtp_on_a_model_without_nextn_is_a_one_line_start_up_error(synth_model) -> None:
    out = _generate(str(synth_model("qwen3moe", "F32", seed=41)), "-p", "Hi", "--draft", "mtp")
    assert out.exit_code == 1
    assert out.output.strip().splitlines() == [
        "error: --draft mtp needs a NextN (MTP) block and this qwen3moe model has none; use --draft none"]


def test_draft_depth_outside_one_to_three_is_refused(synth_model) -> None:
    out = _generate(str(synth_model("glm4moe", "F32", seed=41)), "-p", "Hi", "--draft", "mtp", "--draft-depth", "4")
    lines = out.output.strip().splitlines()
    assert out.exit_code == 1 and len(lines) == 1
    assert lines[0].startswith("error: invalid value for '--draft-depth': 4 is not in the range 1<=x<=3; see ")


def _drafted_generation() -> Generation:
    gen = Generation(prompt_tokens=5, cached_tokens=0, tokens=[1, 2, 3, 4, 5, 6])
    gen.draft = DraftStats()
    gen.draft.record(3, 2, 0.01, 0.02)  # 3 drafted, 2 accepted: 3 tokens
    gen.draft.record(3, 0, 0.01, 0.02)  # 3 drafted, none accepted: 1 token
    gen.draft.record(0, 0, 0.0, 0.01)  # a plain step: 1 token
    return gen


def test_draft_stats_per_depth_and_per_verify_step() -> None:
    t = _drafted_generation().timings()
    assert t["drafted_n"] == 6 and t["accepted_n"] == 2 and t["draft_acceptance"] == 2 / 6
    assert t["drafted_by_depth"] == [2, 2, 2] and t["accepted_by_depth"] == [1, 1, 0]
    assert t["draft_acceptance_by_depth"] == [0.5, 0.5, 0.0]
    assert t["verify_steps"] == 3 and t["tokens_per_verify"] == 5 / 3


def test_server_timings_and_metrics_carry_the_draft_counts() -> None:
    gen = _drafted_generation()
    body = timings(gen, queued_s=0.0)
    assert body["drafted_n"] == 6 and body["accepted_n"] == 2
    assert timings(Generation(prompt_tokens=1, cached_tokens=0), 0.0)["drafted_n"] == 0
    metrics = Metrics()
    metrics.record_generation(gen, ttft_s=0.1, cancelled=False)
    text = metrics.render().decode()
    assert "runner_draft_tokens_total 6.0" in text and "runner_draft_tokens_accepted_total 2.0" in text


def test_chat_summary_shows_the_acceptance() -> None:
    stats = TurnStats.from_generation(_drafted_generation())
    assert stats.draft_acceptance == 2 / 6 and "draft acceptance 33%" in summary(stats)


def test_engine_draft_stats_add_up_over_generations(synth_model) -> None:
    engine = Engine.load(synth_model("glm4moe", "F32", seed=41), EngineConfig(n_ctx=128))
    greedy = SamplingParams(temperature=0.0)
    a = engine.generate([5, 6, 7], 10, greedy, ignore_eos=True, draft=DraftConfig("mtp", 2, adaptive=False)).run()
    b = engine.generate([9, 8, 7], 10, greedy, ignore_eos=True, draft=DraftConfig("mtp", 2, adaptive=False)).run()
    total = engine.draft_stats()
    assert total["drafted_n"] == a.draft.drafted_n + b.draft.drafted_n
    assert total["verify_steps"] == a.draft.verify_steps + b.draft.verify_steps and total["draft_depth"] == 2
