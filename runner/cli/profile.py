"""`runner profile`: one prompt and a short greedy generation, instrumented: where the time to first token
went and how many bytes crossed PCIe, per layer and in routed expert sets (runner/cli/profile_report.py)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import click

from runner.cli.support import (
    announce,
    launch_options,
    model_option,
    one_line_errors,
    read_small_file,
)
from runner.errors import RunnerError

PROMPT_FILE_MAX_BYTES = 64 << 20  # some 16M tokens of text, far past any context


@click.command("profile")
@click.argument("model", required=False, type=click.Path(dir_okay=False))
@click.option("--prompt-file", required=True, type=click.Path(dir_okay=False), help="The prompt, as text.")
@click.option("--prompt-tokens", type=click.IntRange(min=1), multiple=True,
              help="Exactly N prompt tokens: the file's cut to N, or its text repeated up to N. Repeat it for several "
                   "lengths in this process, shortest first, each with its own warm-up and measured prompts.")
@click.option("--gen", "n_gen", type=click.IntRange(min=1), default=16, show_default=True,
              help="Tokens generated (greedy) after the prompt.")
@click.option("--n-ctx", "-c", "--ctx-size", "n_ctx", type=click.IntRange(min=1), default=None, help="Context length [default: prompt + gen].")
@click.option("--warmup", type=click.IntRange(min=0), default=0, show_default=True,
              help="Unreported prompts of the same length run first (other token ids, the same generation), as "
                   "llama-bench's warm-up run: kernels load and memory pools grow outside the measured request.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Measured prompts in this process (each with other token ids, the context emptied between): the "
                   "report's figures are the first's, and `runs` lists every one's time to first token and rates.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Write every figure here.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Draw the copy and compute streams per layer to this PNG (needs the [plot] extra).")
@click.option("--routing", "routing_flag", default="random", show_default=True,
              help="random (the file's router), uniform, or locality-PRESET: synthetic expert ids (uniform, or with "
                   "temporal locality: runner/offload/locality_routing.py) for synthetic files, named in the report.")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Decode by sampling at this temperature (the chain's other settings at their defaults: top-k 40, "
                   "top-p 0.95, min-p 0.05) from --seed; 0 is greedy.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="The sampler's seed.")
@model_option(required=True)
@launch_options
@one_line_errors
def profile_command(model: str, prompt_file: str, prompt_tokens: tuple[int, ...], n_gen: int, n_ctx: int | None,
                    warmup: int, repeat: int, json_out: str | None, plot: str | None, routing_flag: str,
                    temperature: float, seed: int, launch: Any) -> None:
    """Profile one prompt of PROMPT_FILE on MODEL: time to first token, PCIe bytes, stream overlap, decode hits."""
    from runner.cli.profile_plot import plot_timeline, require_matplotlib
    from runner.cli.profile_report import build_report, format_table
    from runner.cli.progress import arena_progress
    from runner.engine.engine import Engine
    from runner.engine.sampling import SamplingParams
    from runner.environment import environment
    from runner.gguf_file import open_gguf
    from runner.launch.resolve import resolve
    from runner.offload.synthetic_routing import RoutingMode, attach, random_routing_record
    from runner.offload.timeline import Timeline

    if plot:
        require_matplotlib()
    mode = RoutingMode.parse(routing_flag)
    if launch.offload is False:
        raise RunnerError("runner profile measures expert offload; --no-offload leaves nothing to measure")
    if launch.devices is not None and "," in launch.devices:  # a split accounts slots per card, runs no cache yet
        raise RunnerError(f"runner profile measures expert offload on one card; --devices {launch.devices} splits "
                          f"the layers, which the numpy emulation runs without a slot cache to measure")
    model_file = open_gguf(model)
    prompts = [prompt_from_file(model_file, prompt_file, n) for n in sorted(set(prompt_tokens)) or [None]]
    plan = resolve(dataclasses.replace(launch, offload=True), model_file, n_ctx or len(prompts[-1]) + n_gen,
                   "-c" if n_ctx else "prompt + gen")
    announce(plan)
    t0 = time.perf_counter()
    with arena_progress() as progress:
        engine = Engine(model_file, plan.engine_config(), ops=plan.make_ops(), arena_progress=progress)
    load = {"s": time.perf_counter() - t0, "host_arena_pinned": engine.offload.store.pinned,
            **engine.offload.store.load_seconds}  # where a large file's load seconds go
    routing = attach(engine, mode)
    n_vocab = engine.model_config.n_vocab
    timeline, clock = _timeline(engine)
    runs, shift = [], 0  # every prompt of the process gets its own shift: no two share more than a first token
    sampling = SamplingParams(temperature=temperature, seed=seed)
    for tokens in prompts:
        warm_up(engine, tokens, n_gen, plan.draft, warmup, first_shift=shift, sampling=sampling)
        shift += warmup
        for _ in range(repeat):  # a fresh timeline per prompt; the report draws the first's
            if runs:
                engine.reset()
                timeline = Timeline(timeline.clock)
            engine.offload.stream.timeline = timeline
            run = profile_run(engine, shifted(tokens, n_vocab, shift) if runs else tokens, n_gen, plan.draft, sampling)
            shift += 1
            run.spans = timeline.spans()
            runs.append(run)
    if routing is not None:
        routing.require_used()
        click.echo(f"routing: SYNTHETIC ({mode.label}): the router's expert ids were replaced; hit rates are the "
                   f"process's, not the model's", err=True)
    layers = layer_facts(engine)
    reports = [build_report(r, layers, clock) for r in runs]
    report = {"environment": environment(), "backend": engine.ops.name, "model": model_facts(engine), "load": load,
              "routing": routing.record() if routing is not None else random_routing_record(),
              "launch": plan.to_dict(), "warmup_prompts": warmup,
              "sampling": {"temperature": temperature, "seed": seed} if temperature > 0 else "greedy", **reports[0],
              "offload_stats": engine.stats(), "runs": [run_figures(r) for r in reports]}
    click.echo(format_table(report))
    if len(prompts) > 1:
        for r in report["runs"]:
            click.echo(f"run          {r['prompt_tokens']} prompt tokens: time to first token {r['ttft_s']:.4f} s "
                       f"({r['prefill_tok_s']:.1f} tok/s), decode {r['decode_tok_s']:.1f} tok/s")
    if json_out:
        _write(json_out, json.dumps(report, indent=1) + "\n")
        click.echo(f"wrote {json_out}", err=True)
    if plot:
        plot_timeline(report, plot)
        click.echo(f"wrote {plot}", err=True)


def prompt_from_file(model_file: Any, path: str, n_tokens: int | None) -> list[int]:
    """The file's text as token ids (BOS as the model wants); with `n_tokens`, cut or repeated to exactly that."""
    from runner.engine.tokenizer import Tokenizer

    raw = read_small_file(path, PROMPT_FILE_MAX_BYTES, "prompt file")  # /dev/zero or a FIFO: refused, not read
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunnerError(f"cannot read the prompt file {path}: {exc}") from None
    tok = Tokenizer(model_file.path, model_file.get("tokenizer.chat_template"))
    ids = tok.encode(text, add_special=True, parse_special=False)
    body = tok.encode(text, add_special=False, parse_special=False)
    if not body:
        raise RunnerError(f"the prompt file {path} is empty")
    while n_tokens is not None and len(ids) < n_tokens:
        ids += body
    return ids[:n_tokens] if n_tokens is not None else ids


def shifted(tokens: list[int], n_vocab: int, i: int) -> list[int]:
    """Prompt number `i` + 1 like `tokens`: the first id kept, every other id moved by i + 1, so no two of a
    process's prompts share more than their first token."""
    return tokens[:1] + [(t + 1 + i) % n_vocab for t in tokens[1:]]


def warm_up(engine: Any, tokens: list[int], n_gen: int, draft: Any, prompts: int, first_shift: int = 0,
            sampling: Any = None) -> None:
    """Run `prompts` unreported prompts like `tokens` (shifted first_shift onwards), then empty the context."""
    from runner.engine.sampling import SamplingParams

    for i in range(first_shift, first_shift + prompts):
        other = shifted(tokens, engine.model_config.n_vocab, i)
        engine.generate(other, n_gen, sampling or SamplingParams(temperature=0.0), ignore_eos=True, draft=draft).run()
        engine.reset()


def run_figures(report: dict[str, Any]) -> dict[str, Any]:
    """One measured prompt's headline figures and stream split, for `runs` (the report's body is the first's)."""
    return {"prompt_tokens": report["prompt"]["tokens"], "ttft_s": report["ttft_s"],
            "prefill_tok_s": report["prefill_tok_s"], "decode_tok_s": report["decode"]["decode_tok_s"],
            "decode_gpu_ms_per_token": report["decode"]["gpu_ms_per_token"],
            "decode_host_ms_per_token": report["decode"]["host_ms_per_token"], "restore_s": report["phase"]["restore_s"],
            "tokens_sha256": report["decode"]["tokens_sha256"],
            "stream_bytes": report["prefill"]["stream_bytes"], "warm_bytes": report["prefill"]["warm_bytes"],
            "warm_device_bytes": report["prefill"]["warm_device_bytes"],
            "uploaded_expert_sets": report["prefill"]["uploaded_expert_sets"],
            **{k: report["timing"][k] for k in ("copy_s", "compute_s", "upload_wait_s", "compute_busy_s",
                                                "exposed_copy_s", "link_idle_s")}}


def profile_run(engine: Any, tokens: list[int], n_gen: int, draft: Any, sampling: Any = None) -> Any:
    """Run the prompt and `n_gen` tokens (greedy, or `sampling`), with engine.stats() before, once the prompt is
    prefilled (before any decode step: a greedy chain submits its first before it yields the first token) and
    after."""
    from runner.cli.profile_report import ProfileRun
    from runner.engine.sampling import SamplingParams

    before = engine.stats()
    gen = engine.generate(tokens, n_gen, sampling or SamplingParams(temperature=0.0), ignore_eos=True, draft=draft)
    t0 = time.perf_counter()
    ttft_s, at_first, reading_s = None, None, 0.0
    ops, replays = engine.ops, None

    def prefilled() -> None:
        nonlocal at_first, replays, reading_s
        t = time.perf_counter()
        at_first = engine.stats()
        if hasattr(ops, "replay_times_ms"):  # CUDA: time the decode's graph replays from here on
            ops.replay_times_ms = replays = []
        reading_s = time.perf_counter() - t  # not the prompt's: left out of its time to first token

    gen.on_prefilled = prefilled
    try:
        for step in gen.steps():
            if ttft_s is None and step.token is not None:
                ttft_s = time.perf_counter() - t0 - reading_s  # the token is on the host: the prompt's work is done
    finally:
        if replays is not None:
            ops.replay_times_ms = None
    if ttft_s is None or at_first is None:
        raise RunnerError("the generation produced no token to time the prompt by")
    return ProfileRun(len(tokens), len(tokens) - gen.cached_tokens, ttft_s, len(gen.tokens), gen.decode_s, before,
                      at_first, engine.stats(), draft=gen.draft.to_dict() if gen.draft is not None else None,
                      replay_gpu_ms=replays or None, token_ids=[int(t) for t in gen.tokens])


def layer_facts(engine: Any) -> dict[int, dict[str, int]]:
    """Per MoE layer a prompt streams (the trunk's, not the NextN block's): its expert set and one expert."""
    store, n_layer = engine.offload.store, engine.model_config.n_layer
    return {i: {"set_bytes": store.layer_bytes(i), "expert_bytes": store.expert_bytes(i)}
            for i in store.layers if i < n_layer}


def model_facts(engine: Any) -> dict[str, Any]:
    from runner.cli.info import model_info

    info = model_info(engine.file)
    streamed = layer_facts(engine)
    set_bytes = sum(v["set_bytes"] for v in streamed.values())
    return {"file": str(engine.file.path), "architecture": info.architecture, "moe_layers": len(streamed),
            "n_expert": engine.model_config.n_expert, "n_expert_used": engine.model_config.n_expert_used,
            "expert_bytes": info.expert_slot_bytes, "routed_set_bytes_in_file": info.routed_expert_bytes,
            "routed_bytes_not_streamed": info.routed_expert_bytes - set_bytes,
            "routed_bytes_per_layer_in_file": info.routed_expert_bytes_per_layer, "quant_mix": info.quant_mix}


def _timeline(engine: Any) -> tuple[Any, dict[str, Any]]:
    from runner.offload.timeline import CudaEventClock, Timeline, WallClock

    if engine.ops.name != "cuda":
        clock = WallClock()
        return Timeline(clock), {"clock": f"{engine.ops.name} backend, {clock.name} (uploads are host copies into "
                                          f"the emulated arena; nothing overlaps)", "gpu_timings": False,
                                 "pinned_h2d_gb_s": None}
    from runner.environment import pinned_h2d_gb_s

    copy_stream = getattr(engine.offload.arena, "copy_stream", None)
    if copy_stream is None:
        raise RunnerError("the CUDA expert arena exposes no copy_stream to time uploads on")
    h2d = pinned_h2d_gb_s()  # before the timeline starts, so it is not in it
    clock = CudaEventClock(copy_stream)
    return Timeline(clock), {"clock": clock.name, "gpu_timings": True, "pinned_h2d_gb_s": h2d}


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise RunnerError(f"cannot write {path}: {exc.strerror or exc}") from None
