"""The `runner` command line: generate, chat, serve, synth, info. Errors become one line and a non-zero exit."""

from __future__ import annotations

import json
import sys

import click

from .cli_support import backend_options, default_model_path, one_line_errors

@click.group()
@click.version_option(package_name="moe-offload-runner")
def main() -> None:
    """An offload runner for Mixture-of-Experts models in GGUF files."""


@main.command()
@click.argument("model", required=False, type=click.Path(dir_okay=False))
@click.option("--prompt", "-p", required=True, help="Prompt text (special tokens are parsed).")
@click.option("--chat", is_flag=True, help="Wrap the prompt as a user message with the model's chat template.")
@click.option("--max-tokens", "-n", default=64, show_default=True, type=click.IntRange(min=0))
@click.option("--temperature", default=0.8, show_default=True, type=float, help="0 means greedy.")
@click.option("--top-k", default=40, show_default=True, type=int)
@click.option("--top-p", default=0.95, show_default=True, type=float)
@click.option("--min-p", default=0.05, show_default=True, type=float)
@click.option("--seed", default=None, type=int, help="Sampling seed (default: random).")
@click.option("--stop", multiple=True, help="Stop string; may be given several times.")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-generation tokens.")
@click.option("--n-ctx", default=4096, show_default=True, type=click.IntRange(min=1))
@click.option("--ubatch", default=512, show_default=True, type=click.IntRange(min=1), help="Prompt micro-batch.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
@backend_options
@click.option("--draft", "draft_mode", type=click.Choice(["none", "mtp"]), default="none", show_default=True,
              help="mtp: draft with the model's NextN block, verify in one batch (same output as none).")
@click.option("--draft-depth", type=click.IntRange(1, 3), default=3, show_default=True,
              help="Tokens drafted per verify step (the most: the depth adapts unless --draft-fixed).")
@click.option("--draft-fixed", is_flag=True, help="Keep --draft-depth instead of adapting it to measured acceptance.")
@one_line_errors
def generate(model: str | None, prompt: str, chat: bool, max_tokens: int, temperature: float, top_k: int,
             top_p: float, min_p: float, seed: int | None, stop: tuple[str, ...], ignore_eos: bool, n_ctx: int, ubatch: int,
             as_json: bool, backend: str, vram_budget: float | None, draft_mode: str, draft_depth: int,
             draft_fixed: bool) -> None:
    """Generate a continuation of PROMPT with MODEL (default: the embedded tiny model)."""
    from .backends import BackendConfig, make_ops
    from .config import model_config
    from .engine import Engine, EngineConfig
    from .gguf_file import open_gguf
    from .sampling import SamplingParams
    from .speculative import DraftConfig, check_draft_support

    path = model or default_model_path()
    draft = DraftConfig(draft_mode, draft_depth, adaptive=not draft_fixed)
    check_draft_support(model_config(open_gguf(path)), draft)  # before any weights are loaded
    ops = make_ops(BackendConfig(backend, vram_budget))
    engine = Engine.load(path, EngineConfig(n_ctx=n_ctx, ubatch=ubatch), ops=ops)
    text = engine.tokenizer.render_chat([{"role": "user", "content": prompt}]) if chat else prompt
    prompt_tokens = engine.tokenizer.encode(text, add_special=True, parse_special=True)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    gen = engine.generate(prompt_tokens, max_tokens, sampling, list(stop), ignore_eos, draft=draft)
    if as_json:
        gen.run()
        out = {"backend": engine.ops.name, "tokens": gen.tokens, "text": gen.text, "prompt_tokens": gen.prompt_tokens,
               "prompt_token_ids": prompt_tokens, "finish_reason": gen.finish_reason, **gen.timings()}
        click.echo(json.dumps(out))
        return
    for piece in gen.pieces():
        click.echo(piece, nl=False)
    click.echo()
    t = gen.timings()
    drafting = f"{gen.draft.summary()}; " if gen.draft is not None else ""
    click.echo(f"[{t['prompt_tokens']} prompt tokens, {t['prefill_tok_s']:.1f} tok/s prefill; "
               f"{t['completion_tokens']} generated, {t['decode_tok_s']:.1f} tok/s decode; "
               f"{drafting}finish: {gen.finish_reason}]", err=True)


@main.command()
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--arch", type=click.Choice(["glm4moe", "qwen3moe"]), default="glm4moe", show_default=True)
@click.option("--preset", default="tiny", show_default=True,
              help="tiny, small, glm45-air, seed (glm4moe), qwen3-30b-a3b (qwen3moe).")
@click.option("--layers", type=click.IntRange(min=1), default=None, help="Trunk layers (default: the preset's).")
@click.option("--experts", type=click.IntRange(min=1), default=None, help="Routed experts per layer.")
@click.option("--quant", default="F32", show_default=True,
              help="F32, F16, BF16, Q8_0, or a llama.cpp mix such as Q4_K_M, Q5_K_M, Q6_K, IQ4_XS.")
@click.option("--seed", default=0, show_default=True, type=int)
@one_line_errors
def synth(out: str, arch: str, preset: str, layers: int | None, experts: int | None, quant: str,
          seed: int) -> None:
    """Write a GGUF of a real architecture with random weights to OUT."""
    from .synth import planned_bytes, synthesize

    estimate = planned_bytes(arch, preset, quant, layers, experts)
    if estimate:
        with click.progressbar(length=estimate, label=f"writing {out}", file=sys.stderr) as bar:
            result = synthesize(out, arch, preset, quant, seed, layers, experts, progress=bar.update)
    else:
        result = synthesize(out, arch, preset, quant, seed, layers, experts)
    click.echo(f"wrote {result.path} ({arch} {preset}, {result.quant}, {result.path.stat().st_size / 2**20:.1f} MiB)")


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def info(model: str, as_json: bool) -> None:
    """Describe MODEL: shape, quant mix, resident bytes vs the routed expert set, one expert slot."""
    from .gguf_file import open_gguf
    from .info import format_info, model_info

    result = model_info(open_gguf(model))
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else format_info(result))


def _register_session_commands() -> None:
    from .chat import chat_command
    from .server import serve_command

    main.add_command(chat_command)
    main.add_command(serve_command)


_register_session_commands()

if __name__ == "__main__":
    main()
