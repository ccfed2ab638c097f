"""The context a launch runs with: -c as given (refused in one line when it does not fit), else the model's
context_length capped by what the VRAM budget leaves the KV cache, stated in the launch line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf_edit import rewrite_gguf

from runner.cli.main import main
from runner.engine.engine import Engine
from runner.errors import DeviceMemoryError
from runner.gguf_file import open_gguf
from runner.launch import resolve as launch_module
from runner.launch.context import CTX_ALIGN, FIT_CTX_MIN
from runner.launch.resolve import LaunchOptions, resolve

NUMPY = LaunchOptions(backend="numpy")
# A 51.2 MiB card where decoding binds the context (per-microbatch prefill keeps no hidden state per position)
CARD_FLAGS = ["--cache-slots", "6", "--prefill-order", "per_microbatch", "--prefill-ubatch", "16",
              "--vram-budget", "0.05"]
SMALL_CARD = LaunchOptions(backend="numpy", cache_slots="6", prefill_order="per_microbatch", prefill_ubatch=16,
                           vram_budget_gib=0.05)


@pytest.fixture(scope="module")
def long_model(synth_model, tmp_path_factory) -> Path:
    """The tiny glm4moe (Q8_0, 1.5 KiB of f16 KV cache per token) claiming a 128k context, as GLM-4.5 does."""
    return rewrite_gguf(synth_model("glm4moe", "Q8_0"), tmp_path_factory.mktemp("ctx") / "tiny-128k.gguf",
                        {"glm4moe.context_length": 131072})


@pytest.fixture(scope="module")
def model_8k(synth_model, tmp_path_factory) -> Path:
    return rewrite_gguf(synth_model("glm4moe", "Q8_0"), tmp_path_factory.mktemp("ctx") / "tiny-8k.gguf",
                        {"glm4moe.context_length": 8192})


def _generate(*args: str):
    return CliRunner().invoke(main, ["generate", *args, "-p", "hi", "-n", "2", "--temperature", "0", "--json"])


def test_without_c_the_context_is_the_models_context_length(model_8k) -> None:
    plan = resolve(NUMPY, open_gguf(model_8k))
    assert plan.offload is None and plan.n_ctx == 8192 and plan.context.why == "the model's context_length 8192"
    out = _generate(str(model_8k), "--backend", "numpy")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["launch"]["n_ctx"] == 8192 and out.stderr == ""  # all resident, as the model says


def test_an_offloaded_launch_states_its_context_and_why(model_8k) -> None:
    out = _generate(str(model_8k), "--backend", "numpy", "--cache-slots", "4")
    assert out.exit_code == 0, out.output
    assert out.stderr.startswith("launch: ") and out.stderr.rstrip().endswith(
        "context 8192 (the model's context_length 8192)")


def test_a_small_budget_caps_the_default_to_what_its_kv_cache_can_hold(long_model) -> None:
    f = open_gguf(long_model)
    plan = resolve(SMALL_CARD, f)
    n = plan.n_ctx
    assert FIT_CTX_MIN < n < 131072 and n % CTX_ALIGN == 0
    assert "the model's 131072 cut to what the 0.05 GiB --vram-budget leaves the KV cache" in plan.context.why
    assert resolve(SMALL_CARD, f, n).n_ctx == n  # what the default chose, -c takes
    with pytest.raises(DeviceMemoryError, match=r"at most \d+ tokens fit"):
        resolve(SMALL_CARD, f, n + 4 * CTX_ALIGN)  # a little more is past the budget (the default keeps 2% free)
    engine = Engine(f, plan.engine_config())  # the emulated card holds the KV cache, slots and prefill buffers
    assert engine.n_ctx == n and engine.offload.budget.held["kv cache"] == n * 3 * 512


def test_the_capped_context_and_why_are_in_the_launch_line(long_model) -> None:
    out = _generate(str(long_model), "--backend", "numpy", *CARD_FLAGS)
    assert out.exit_code == 0, out.output
    n = json.loads(out.stdout)["launch"]["n_ctx"]
    (line,) = out.stderr.splitlines()
    assert f"context {n} (the model's 131072 cut to what the 0.05 GiB --vram-budget leaves the KV cache and " \
           f"decode attention partials at 1.6 KiB per token beside resident weights 2.5 MiB, 6 expert slots per layer 3.6 MiB, decode workspaces " \
           f"120.0 KiB (decoding))" in line


def test_an_f32_kv_cache_takes_twice_the_bytes_per_token(long_model) -> None:
    f = open_gguf(long_model)
    half, full = resolve(SMALL_CARD, f), resolve(dataclasses.replace(SMALL_CARD, kv_type="f32"), f)
    # K/V 1.5 and 3.0 KiB a token, with 0.1 KiB of the decode attention's split partials (float32 either way)
    assert "1.6 KiB per token" in half.context.why and "3.1 KiB per token" in full.context.why
    assert full.n_ctx < half.n_ctx and full.backend.kv_type == "f32" and "K/V cache f32" in full.summary()
    engine = Engine(f, full.engine_config(), full.make_ops())
    assert engine.kv.k[0].dtype == np.float32 and engine.offload.budget.held["kv cache"] == full.n_ctx * 3 * 1024


def test_more_slots_or_a_drafter_leave_less_context(long_model, tmp_path) -> None:
    f = open_gguf(long_model)
    base = resolve(SMALL_CARD, f).n_ctx
    assert resolve(LaunchOptions(**{**SMALL_CARD.__dict__, "cache_slots": "8"}), f).n_ctx < base
    drafting = resolve(LaunchOptions(**{**SMALL_CARD.__dict__, "draft": "mtp", "draft_depth": 1}), f)
    assert drafting.n_ctx < base and "2.1 KiB per token" in drafting.context.why  # the NextN block's cache too


def test_a_profile_budget_caps_the_context_it_leaves(long_model, tmp_path) -> None:
    profile = tmp_path / "small-card.toml"
    profile.write_text("[profile]\nname = 'small-card'\n[launch]\nvram_budget_gib = 0.05\ncache_slots = 6\n"
                       "prefill_ubatch = 16\n[evidence]\nqualified_on = 'a test'\n")
    plan = resolve(LaunchOptions(backend="numpy", profile=str(profile), prefill_order="per_microbatch"),
                   open_gguf(long_model))
    assert plan.n_ctx == resolve(SMALL_CARD, open_gguf(long_model)).n_ctx
    assert "cut to what the 0.05 GiB VRAM budget of profile 'small-card' leaves" in plan.context.why


def test_cache_slots_auto_keeps_the_fit_ctx_floor_and_says_so(long_model) -> None:
    f = open_gguf(long_model)
    plan = resolve(LaunchOptions(backend="numpy", cache_slots="auto"), f)
    assert plan.n_ctx == FIT_CTX_MIN and "--fit-ctx floor" in plan.context.why and "-c N for more" in plan.context.why
    assert resolve(LaunchOptions(backend="numpy", cache_slots="auto"), f, 65536).n_ctx == 65536  # -c still wins


def test_a_model_that_fits_at_the_floor_stays_resident_with_its_context_capped(long_model, monkeypatch) -> None:
    # 20 MiB: the 7.3 MiB of weights and 4096 tokens of KV cache fit, 131072 tokens (192 MiB) do not
    monkeypatch.setattr(launch_module, "EMULATED_CARD_GIB", 20 / 1024)
    plan = resolve(NUMPY, open_gguf(long_model))
    assert plan.offload is None and FIT_CTX_MIN <= plan.n_ctx < 131072 and plan.worth_announcing
    assert "cut to what the 0.02 GiB emulated card (numpy backend) leaves the KV cache" in plan.context.why


def test_explicit_c_wins_and_is_said_when_cut_to_the_model(model_8k) -> None:
    f = open_gguf(model_8k)
    asked = resolve(NUMPY, f, 512)
    assert asked.n_ctx == 512 and asked.context.why == "-c 512" and not asked.worth_announcing
    cut = resolve(NUMPY, f, 100_000)
    assert cut.n_ctx == 8192 and cut.context.why == "-c 100000 cut to the model's context_length 8192"
    assert cut.worth_announcing  # a resident launch says so too


def test_an_explicit_c_past_the_budget_is_one_line_saying_what_it_needs(long_model) -> None:
    out = CliRunner().invoke(main, ["generate", str(long_model), "-p", "hi", "--backend", "numpy", *CARD_FLAGS,
                                    "-c", "100000"])
    assert out.exit_code == 1 and len(out.output.splitlines()) == 1
    assert out.output.startswith("error: a context of 100000 tokens (-c 100000) needs 152.8 MiB of KV cache "
                                 "and decode attention partials (1.6 KiB per token) but the 0.05 GiB --vram-budget has ")
    assert "beside resident weights 2.5 MiB, 6 expert slots per layer 3.6 MiB" in out.output
    most = int(out.output.split("at most ")[1].split()[0])
    assert out.output.rstrip().endswith(f"use -c {most // CTX_ALIGN * CTX_ALIGN} or leave -c out")


def test_no_room_for_any_context_is_one_line_naming_the_remedy(long_model) -> None:
    tiny_card = LaunchOptions(backend="numpy", cache_slots="4", prefill_ubatch=16, vram_budget_gib=0.006)
    with pytest.raises(DeviceMemoryError, match=r"^a context of 256 tokens needs .* raise the VRAM budget or lower "
                                                r"--cache-slots and --prefill-ubatch$"):
        resolve(tiny_card, open_gguf(long_model))


def test_serve_defaults_to_the_models_context_and_says_so_without_a_bar(model_8k) -> None:
    from test_server_cli import serve, stderr_lines

    proc = serve(str(model_8k), "--port", "0", "--backend", "numpy", "--cache-slots", "4")
    try:
        lines, seen = stderr_lines(proc), []
        while not seen or "serving" not in seen[-1]:
            seen.append(lines.get(timeout=60))
        assert seen[0].startswith("launch: ") and seen[0].rstrip().endswith("context 8192 (the model's context_length 8192)")
        assert seen[-1].rstrip().endswith("(context 8192)")
        assert not [line for line in seen if "arena" in line or "\r" in line]  # stderr is a pipe: no bar
    finally:
        proc.kill()
        proc.wait(30)


def test_profile_runs_at_prompt_plus_gen_and_says_so(model_8k, tmp_path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("the expert cache streams every layer once")
    out = CliRunner().invoke(main, ["profile", str(model_8k), "--prompt-file", str(prompt), "--prompt-tokens", "20",
                                    "--gen", "4", "--backend", "numpy", "--cache-slots", "4", "--prefill-ubatch", "8"])
    assert out.exit_code == 0, out.output
    assert out.stderr.splitlines()[0].endswith("context 24 (prompt + gen)")
