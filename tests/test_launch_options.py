"""The launch flags of generate, chat and serve: profile choice, refusals, offload output and its figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from runner.cli.main import main
from runner.cli.serve import serve_command
from runner.errors import ProfileError
from runner.gguf_file import open_gguf
from runner.launch import resolve as launch_module
from runner.launch.resolve import LaunchOptions, resolve

OFFLOAD = ["--cache-slots", "3", "--prefill-ubatch", "8", "--ubatch", "8", "--transaction", "always"]
GREEDY = ["-p", "The expert cache must not change a single token of this reply", "-n", "12", "--temperature", "0",
          "--ignore-eos", "--backend", "numpy"]


@pytest.fixture(scope="module")
def path(synth_model) -> str:
    return str(synth_model("glm4moe", "Q8_0"))


def _generate(*args: str):
    return CliRunner().invoke(main, ["generate", *args])


def _profile(tmp_path: Path, **launch: object) -> Path:
    """A profile file that suits the tiny model (8 experts per layer, a NextN block)."""
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in launch.items())
    p = tmp_path / "tiny-test.toml"
    p.write_text(f"[profile]\nname = 'tiny-test'\n[launch]\n{body}\n[evidence]\nqualified_on = 'a test'\n")
    return p


def test_the_default_launch_keeps_every_expert_resident_when_the_model_fits(path) -> None:
    plan = resolve(LaunchOptions(backend="numpy"), open_gguf(path), 4096)
    assert plan.offload is None and plan.settings.profile is None and not plan.draft.enabled
    assert plan.why.startswith("every expert resident: the model's") and "fit the 24.00 GiB emulated card" in plan.why
    out = _generate(path, *GREEDY, "--json")
    assert out.exit_code == 0 and "launch:" not in out.output  # a resident launch says nothing extra
    result = json.loads(out.output)
    assert result["offload_stats"] is None and "cache_hits" not in result and result["launch"]["offload"] is None


def test_offloaded_greedy_output_equals_resident_output_and_reports_its_figures(path) -> None:
    resident = json.loads(_generate(path, *GREEDY, "--json").output)
    out = _generate(path, *GREEDY, *OFFLOAD, "--json")
    assert out.exit_code == 0, out.output
    lines = out.output.strip().splitlines()
    assert lines[0].startswith("launch: unqualified expert offload as asked") and "3 cache slots per MoE layer" in lines[0]
    assert "warm fill from host" in lines[0]
    staged = _generate(path, *GREEDY, *OFFLOAD, "--warm-fill", "staging", "--json")
    assert "warm fill from staging" in staged.output.splitlines()[0]
    assert json.loads(staged.output.strip().splitlines()[-1])["tokens"] == resident["tokens"]
    segments = _generate(path, *GREEDY, *OFFLOAD, "--decode-graph", "segments", "--json")
    assert "CUDA decode graphs by segments" in segments.output.splitlines()[0]
    assert "decode graphs" not in lines[0]  # directory, the default, goes unsaid
    assert json.loads(segments.output.strip().splitlines()[-1])["tokens"] == resident["tokens"]  # numpy: no graphs
    result = json.loads(lines[-1])
    assert result["tokens"] == resident["tokens"] and len(set(result["tokens"])) > 3
    stats = result["offload_stats"]
    assert result["cache_hits"] == stats["cache"]["total"]["hits"] and result["cache_misses"] > 0
    assert result["prefill_bytes"] == stats["prefill"]["total"]["bytes"] > 0
    assert result["prefill_expert_sets"] == pytest.approx(1.0)  # layer-major: the set crosses once
    assert result["bytes_uploaded"] == (result["prefill_bytes"] + stats["cache"]["total"]["bytes_uploaded"]
                                        + stats["cache"]["total"]["warm_bytes"])
    assert result["phase_begins"] == result["phase_ends"] == 1 and result["phase_release_s"] >= 0
    assert result["launch"]["offload"]["cache_slots"] == 3 and result["launch"]["settings"]["server_ubatch"] == 8


def test_the_summary_line_carries_the_offload_figures(path) -> None:
    out = _generate(path, *GREEDY, *OFFLOAD)
    assert out.exit_code == 0, out.output
    summary = out.output.strip().splitlines()[-1]
    assert "expert cache" in summary and "misses" in summary and "MiB uploaded (prefill 1.00 expert sets" in summary
    assert "phase release" in summary and summary.endswith("finish: length]")


def test_a_profile_that_does_not_suit_the_model_is_a_one_line_start_up_error(path) -> None:
    out = _generate(path, "-p", "hi", "--backend", "numpy", "--profile", "home-24g")
    assert out.exit_code == 1
    assert out.output.strip().splitlines() == [
        "error: profile 'home-24g' does not suit this model: it holds 150 cache slots per MoE layer and this model "
        "has 8 routed experts per layer; launch unqualified with --profile none (add --cache-slots N|auto to offload "
        "experts)"]


def test_more_slots_than_experts_per_layer_is_a_one_line_start_up_error(path) -> None:
    out = _generate(path, "-p", "hi", "--backend", "numpy", "--cache-slots", "150")
    assert out.exit_code == 1 and len(out.output.strip().splitlines()) == 1
    assert out.output.startswith("error: --cache-slots 150 is more than the 8 routed experts per MoE layer")
    bad = _generate(path, "-p", "hi", "--backend", "numpy", "--cache-slots", "many")
    assert bad.exit_code == 1 and bad.output.startswith("error: --cache-slots must be a positive number")


def test_explicit_flags_that_contradict_a_profile_are_refused_with_the_profile_message(path, tmp_path) -> None:
    profile = _profile(tmp_path, cache_slots=6, prefill_ubatch=8, server_ubatch=8, drafter="mtp", draft_depth=2)
    out = _generate(path, "-p", "hi", "--backend", "numpy", "--profile", str(profile), "--cache-slots", "4",
                    "--draft-depth", "2", "--ubatch", "16")
    assert out.exit_code == 1 and len(out.output.strip().splitlines()) == 1
    assert "contradict profile 'tiny-test' (2 mismatches): --ubatch 16 (profile: 8); --cache-slots 4 (profile: 6)" \
        in out.output and "--profile none to launch unqualified" in out.output
    for flags in (["--no-offload"],):
        refused = _generate(path, "-p", "hi", "--backend", "numpy", "--profile", str(profile), *flags)
        assert refused.exit_code == 1 and "--no-offload contradicts profile 'tiny-test'" in refused.output


def test_a_suiting_profile_sets_every_launch_setting_and_none_launches_unqualified(path, tmp_path) -> None:
    profile = _profile(tmp_path, cache_slots=6, prefill_ubatch=8, server_ubatch=8, drafter="mtp", draft_depth=2)
    plan = resolve(LaunchOptions(profile=str(profile), cache_slots="6", backend="numpy"), open_gguf(path), 128)
    assert plan.settings.profile == "tiny-test" and plan.offload.cache_slots == 6
    assert plan.offload.decode_batch == 3 and plan.draft.enabled and plan.draft.depth == 2
    assert plan.engine_config(128).ubatch == 8
    free = resolve(LaunchOptions(profile="none", cache_slots="4", prefill_order="per_microbatch", cache_policy="lfu",
                                 backend="numpy"), open_gguf(path), 128)
    assert free.settings.profile is None and free.why == "unqualified (--profile none)"
    assert (free.offload.cache_slots, free.offload.prefill_order, free.offload.cache_policy) == (4, "per_microbatch", "lfu")
    assert resolve(LaunchOptions(profile="none", backend="numpy"), open_gguf(path), 128).offload is None


def test_no_offload_with_an_offload_setting_is_refused(path) -> None:
    with pytest.raises(ProfileError, match="--cache-slots, --prefill-order configure expert offload, which --no-offload"):
        resolve(LaunchOptions(offload=False, cache_slots="4", prefill_order="layer_major"), open_gguf(path), 128)


def test_auto_applies_the_qualified_profile_when_the_model_does_not_fit(path, tmp_path, monkeypatch) -> None:
    profile = _profile(tmp_path, cache_slots=5, prefill_ubatch=16)
    monkeypatch.setattr(launch_module, "AUTO_PROFILE", str(profile))
    # 6.96 MiB: the tiny model's 7.3 MiB do not fit; offloaded, it does (its context checked against the same card)
    monkeypatch.setattr(launch_module, "EMULATED_CARD_GIB", 0.0068)
    plan = resolve(LaunchOptions(backend="numpy"), open_gguf(path), 128)
    assert plan.settings.profile == "tiny-test" and plan.offload.cache_slots == 5
    assert plan.why.startswith("profile 'tiny-test': the model's") and "do not fit the 0.01 GiB emulated card" in plan.why
    with pytest.raises(ProfileError, match=r"--profile auto chose 'tiny-test' \(.*\): the explicit settings contradict"):
        resolve(LaunchOptions(backend="numpy", cache_slots="4"), open_gguf(path), 128)


def test_auto_offloads_unqualified_and_says_why_when_the_profile_does_not_suit(path, monkeypatch) -> None:
    monkeypatch.setattr(launch_module, "EMULATED_CARD_GIB", 0.0068)  # room for the offloaded launch, not for the model
    plan = resolve(LaunchOptions(backend="numpy", prefill_ubatch=16), open_gguf(path), 128)
    assert plan.settings.profile is None and plan.offload.cache_slots == "auto"
    assert "profile 'home-24g' does not suit this model (it holds 150 cache slots" in plan.why


def test_serve_refuses_a_contradicting_launch_before_binding(path) -> None:
    out = CliRunner().invoke(serve_command, [path, "--backend", "numpy", "--cache-slots", "150", "--port", "1"])
    assert out.exit_code == 1 and out.output.startswith("error: --cache-slots 150 is more than")


def test_chat_turns_report_cache_hits_and_bytes_and_stats_shows_offload_totals(path) -> None:
    from runner.cli.chat import stats_text, summary
    from runner.cli.chat_session import ChatSession, ChatSettings
    from runner.engine.engine import Engine

    plan = resolve(LaunchOptions(cache_slots="3", prefill_ubatch=8, backend="numpy"), open_gguf(path), 256)
    session = ChatSession(Engine.load(path, plan.engine_config(256)), ChatSettings(temperature=0, max_tokens=8),
                          draft=plan.draft)
    turn = session.chat("Tell me about experts")
    assert turn.cache_hit_rate is not None and turn.pcie_bytes > 0
    assert "expert cache hits" in summary(turn) and "PCIe" in summary(turn)
    text = stats_text(session)
    assert "expert offload: 3 slots per MoE layer (lru)" in text and "expert cache:" in text
    assert "no real routing locality" in text and "prefill streaming (layer_major)" in text
