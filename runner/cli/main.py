"""The `runner` command line: generate, chat, serve, profile, synth, info, parity. Errors become one line and a
non-zero exit."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from runner.cli.support import (
    CTX_HELP,
    SEED,
    TEXT,
    OneLineErrorsGroup,
    announce,
    chat_template_option,
    default_model_path,
    launch_options,
    model_option,
    one_line_errors,
)
from runner.launch.resolve import LaunchOptions

# Far past any real MoE (under 100 layers, at most 512 routed experts): a typo here would build a tensor plan or a
# process pool that fills the host before the first byte is written.
SYNTH_MAX_LAYERS, SYNTH_MAX_EXPERTS, SYNTH_MAX_JOBS = 1024, 8192, 1024


@click.group(cls=OneLineErrorsGroup)
@click.version_option(package_name="moe-offload-runner")
def main() -> None:
    """An offload runner for Mixture-of-Experts models in GGUF files."""


@main.command()
@click.argument("model", required=False, type=click.Path(dir_okay=False))
@click.option("--prompt", "-p", required=True, type=TEXT, help="Prompt text (special tokens are parsed).")
@click.option("--chat", is_flag=True, help="Wrap the prompt as a user message with the model's chat template.")
@click.option("--max-tokens", "-n", "--n-predict", "max_tokens", default=64, show_default=True,
              type=click.IntRange(min=0))
@click.option("--temperature", default=0.8, show_default=True, type=float, help="0 means greedy.")
@click.option("--top-k", default=40, show_default=True, type=int)
@click.option("--top-p", default=0.95, show_default=True, type=float)
@click.option("--min-p", default=0.05, show_default=True, type=float)
@click.option("--seed", default=None, type=SEED, help="Sampling seed (default: random).")
@click.option("--stop", multiple=True, type=TEXT, help="Stop string; may be given several times.")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-generation tokens.")
@click.option("--n-ctx", "-c", "--ctx-size", "n_ctx", default=None, type=click.IntRange(min=1), help=CTX_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
@chat_template_option
@model_option()
@launch_options
@one_line_errors
def generate(model: str | None, prompt: str, chat: bool, max_tokens: int, temperature: float, top_k: int,
             top_p: float, min_p: float, seed: int | None, stop: tuple[str, ...], ignore_eos: bool, n_ctx: int | None,
             as_json: bool, chat_template: str | None, launch: LaunchOptions) -> None:
    """Generate a continuation of PROMPT with MODEL (default: the embedded tiny model)."""
    from runner.cli.progress import arena_progress
    from runner.engine.engine import Engine
    from runner.engine.sampling import SamplingParams
    from runner.gguf_file import open_gguf
    from runner.launch.resolve import resolve
    from runner.offload.figures import counted_steps

    model_file = open_gguf(model or default_model_path())
    plan = resolve(launch, model_file, n_ctx)  # before any weights are loaded
    announce(plan)
    with arena_progress() as progress:
        engine = Engine(model_file, plan.engine_config(), ops=plan.make_ops(), chat_template=chat_template,
                        arena_progress=progress)
    text = engine.tokenizer.render_chat([{"role": "user", "content": prompt}]) if chat else prompt
    prompt_tokens = engine.tokenizer.encode(text, add_special=True, parse_special=True)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    gen = engine.generate(prompt_tokens, max_tokens, sampling, list(stop), ignore_eos, draft=plan.draft)
    steps = counted_steps(engine, gen)
    if as_json:
        for _ in steps:
            pass
        out = {"backend": engine.ops.name, "tokens": gen.tokens, "text": gen.text, "prompt_tokens": gen.prompt_tokens,
               "prompt_token_ids": prompt_tokens, "finish_reason": gen.finish_reason, **gen.timings(),
               "launch": plan.to_dict(), "offload_stats": engine.stats() or None}
        click.echo(json.dumps(out))
        return
    for step in steps:
        if step.text:
            click.echo(step.text, nl=False)
    click.echo()
    click.echo(generate_summary(gen), err=True)


def generate_summary(gen: Any) -> str:
    """The one-line summary of a generation: prefill and decode separately, drafting and offload figures."""
    t = gen.timings()
    parts = [f"{t['prompt_tokens']} prompt tokens, {t['prefill_tok_s']:.1f} tok/s prefill",
             f"{t['completion_tokens']} generated, {t['decode_tok_s']:.1f} tok/s decode"]
    if gen.draft is not None:
        parts.append(gen.draft.summary())
    if gen.offload is not None:
        parts.append(offload_phrase(gen.offload))
    parts.append(f"finish: {gen.finish_reason}")
    return "[" + "; ".join(parts) + "]"


def offload_phrase(f: dict[str, Any]) -> str:
    """Expert offload figures of one request, for summary lines."""
    rate = f"{f['cache_hit_rate']:.0%}" if f["cache_hit_rate"] is not None else "-"
    phase = ""
    if f["phase_release_s"] is not None:
        phase = f", phase release {f['phase_release_s']:.4f} s restore {f['phase_restore_s']:.4f} s"
    return (f"expert cache {f['cache_hits']} hits {f['cache_misses']} misses ({rate}), "
            f"{f['bytes_uploaded'] / 2**20:.1f} MiB uploaded (prefill {f['prefill_expert_sets']:.2f} expert sets{phase})")


@main.command()
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--arch", type=click.Choice(["glm4moe", "qwen3moe", "qwen35moe", "qwen3next"]), default="glm4moe",
              show_default=True)
@click.option("--preset", default="tiny", show_default=True,
              help="tiny, small, glm45-air, seed (glm4moe), qwen3-30b-a3b (qwen3moe), qwen35-35b-a3b, "
                   "qwen35-397b-a17b (qwen35moe), tiny-ssm-in, qwen3next-80b-a3b (qwen3next); tiny-fused (every "
                   "family: tiny with attn_qkv, a per-block expert width and, in the hybrids, ffn_gate_up_exps).")
@click.option("--layers", type=click.IntRange(1, SYNTH_MAX_LAYERS), default=None,
              help="Trunk layers (default: the preset's).")
@click.option("--experts", type=click.IntRange(1, SYNTH_MAX_EXPERTS), default=None, help="Routed experts per layer.")
@click.option("--quant", default="F32", show_default=True,
              help="F32, F16, BF16, Q8_0, or a llama.cpp mix such as Q4_K_M, Q5_K_M, Q6_K, IQ4_XS.")
@click.option("--seed", default=0, show_default=True, type=SEED)
@click.option("--jobs", type=click.IntRange(1, SYNTH_MAX_JOBS), default=None,
              help="Worker processes drawing tensors (default: the CPU count; the file is the same for any count).")
@one_line_errors
def synth(out: str, arch: str, preset: str, layers: int | None, experts: int | None, quant: str,
          seed: int, jobs: int | None) -> None:
    """Write a GGUF of a real architecture with random weights to OUT."""
    from runner.synth import planned_bytes, synthesize

    jobs = jobs or os.cpu_count() or 1
    estimate = planned_bytes(arch, preset, quant, layers, experts)
    if estimate:
        with click.progressbar(length=estimate, label=f"writing {out}", file=sys.stderr) as bar:
            result = synthesize(out, arch, preset, quant, seed, layers, experts, progress=bar.update, jobs=jobs)
    else:
        result = synthesize(out, arch, preset, quant, seed, layers, experts, jobs=jobs)
    click.echo(f"wrote {result.path} ({arch} {preset}, {result.quant}, {result.path.stat().st_size / 2**20:.1f} MiB)")


@main.command()
@click.argument("model", required=False, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def info(model: str | None, as_json: bool) -> None:
    """Describe MODEL (default: the embedded demo model): shape, quant mix, resident bytes vs the routed
    expert set, one expert slot."""
    from runner.cli.info import format_info, model_info
    from runner.gguf_file import open_gguf

    result = model_info(open_gguf(model or default_model_path()))
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else format_info(result))


def _register_commands() -> None:
    from runner.cli.chat import chat_command
    from runner.cli.parity import parity_command
    from runner.cli.profile import profile_command
    from runner.cli.serve import serve_command

    main.add_command(chat_command)
    main.add_command(serve_command)
    main.add_command(profile_command)
    main.add_command(parity_command)


_register_commands()

if __name__ == "__main__":
    main()
