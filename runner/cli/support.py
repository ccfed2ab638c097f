"""What every command shares: the launch flags, one-line errors, the embedded default model."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
import sys
from collections.abc import Iterator
from functools import wraps
from pathlib import Path
from typing import Any, Callable

import click
import numpy as np

from runner.errors import USER_ERRORS, RunnerError
from runner.package_data import demo_model_path


def not_utf8(text: str) -> str | None:
    """Why `text` is not valid UTF-8 (None when it is). Python hands undecodable bytes of an argument or a
    terminal line over as lone surrogates (surrogateescape), which would fail deep inside the tokenizer."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        return f"not valid UTF-8 ({what} at character {exc.start})"
    return None


class Utf8Text(click.ParamType):
    """Text for the model (a prompt, a stop string, a system prompt): refused unless it is valid UTF-8."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        problem = not_utf8(value) if isinstance(value, str) else None
        if problem:
            self.fail(problem, param, ctx)
        return value


class VramBudgetGib(click.ParamType):
    """--vram-budget: a number of GiB from 1 MiB to 1 PiB (float() alone takes 'nan' and 'inf')."""

    name = "GIB"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from runner.launch.profiles import check_vram_budget

        if "," in str(value):  # llama.cpp habits: one figure per card
            self.fail(f"{value!r}: give one number of GiB; with --devices every card gets that budget", param, ctx)
        try:
            gib = float(value)
            check_vram_budget(gib)
        except ValueError:
            self.fail(f"{value!r} is not a number of GiB", param, ctx)
        except RunnerError as exc:
            self.fail(str(exc).removeprefix("--vram-budget "), param, ctx)
        return gib


class DeviceIds(click.ParamType):
    """--devices: comma-separated distinct non-negative ids (what the backend sees is checked at launch)."""

    name = "ID[,ID...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from runner.launch.devices import parse_devices

        try:
            parse_devices(value)
        except RunnerError as exc:
            self.fail(str(exc).removeprefix("--devices").lstrip(": "), param, ctx)
        return str(value)


class KVCacheType(click.ParamType):
    """--cache-type (and llama.cpp's -ctk/-ctv): f16 or f32, in any case."""

    name = "f16|f32"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from runner.backends.kv_type import check_kv_type

        try:
            return check_kv_type(str(value).lower())
        except ValueError:
            self.fail(f"{value!r}: the K/V cache stores f16 (the default, llama.cpp's) or f32; quantized K/V caches "
                      f"(q8_0, q4_0, ...) are not supported", param, ctx)


TEXT = Utf8Text()
CTX_HELP = ("Context length [default: the model's context_length, cut to what the VRAM budget leaves the KV cache; "
            "4096 when --cache-slots auto fills the budget]; the launch line says which and why.")
# A seed is drawn into numpy's generator, which takes any non-negative int; the server reduces seeds to 64 bits,
# and so does this range (a longer one would only be a typo).
SEED = click.IntRange(0, 2**64 - 1)

_LAUNCH_OPTIONS = (
    click.option("--profile", default="auto", show_default=True,
                 help="Launch profile: NAME (profiles/NAME.toml) or a .toml path; auto: every expert resident when "
                      "the model fits the VRAM budget, else home-24g; none: unqualified."),
    click.option("--offload/--no-offload", default=None,
                 help="Routed experts in host RAM behind a per-layer GPU slot cache (default: on with a profile or "
                      "any offload setting, else off)."),
    click.option("--cache-slots", default=None, metavar="N|auto",
                 help="Expert cache slots per MoE layer; auto fills the VRAM budget (implies --offload)."),
    click.option("--cache-policy", type=click.Choice(["lru", "lfu"]), default=None,
                 help="Slot eviction policy [default: lru] (implies --offload)."),
    click.option("--prefill-order", type=click.Choice(["layer_major", "per_microbatch"]), default=None,
                 help="How a prompt streams experts [default: layer_major] (implies --offload)."),
    click.option("--prefill-ubatch", type=click.IntRange(min=1), default=None,
                 help="Micro-batch inside the prefill phase [default: the profile's, else 2048] (implies --offload)."),
    click.option("--transaction", type=click.Choice(["auto", "always", "never"]), default=None,
                 help="Run prompts in the prefill phase transaction: auto lets the cost model decide per prompt "
                      "[default: auto] (implies --offload)."),
    click.option("--warm-fill", type=click.Choice(["host", "staging"]), default=None,
                 help="Where a prompt's warm slots come from: host re-uploads them after the prompt; staging copies "
                      "them device to device from the prompt's staging buffers when the budget holds slots and "
                      "buffers at once, else host (counted) [default: host] (implies --offload)."),
    click.option("--decode-graph", type=click.Choice(["segments", "directory"]), default=None,
                 help="CUDA decode under offload: segments cuts each step's graph at every router for the host to "
                      "serve the experts; directory runs each step as one graph, the experts served by a device "
                      "directory per layer; segments where the host store is not pinned [default: directory] (implies --offload)."),
    click.option("--ubatch", "-ub", "--ubatch-size", "ubatch", type=click.IntRange(min=1), default=None,
                 help="Prompt micro-batch outside the prefill phase [default: the profile's, else 512]."),
    click.option("--draft", type=click.Choice(["none", "mtp"]), default=None,
                 help="mtp: draft with the model's NextN block, verify in one batch (same output as none) "
                      "[default: the profile's, else none]."),
    click.option("--draft-depth", type=click.IntRange(1, 3), default=None,
                 help="Most tokens drafted per verify step [default: the profile's, else 3 with --draft mtp]."),
    click.option("--draft-fixed", is_flag=True, help="Keep --draft-depth instead of adapting it to measured acceptance."),
    click.option("--vram-budget", "vram_budget_gib", type=VramBudgetGib(), default=None,
                 help="GiB of device memory to use [default: the profile's, else all that is free; numpy: the "
                      "emulated card with offload, 24]."),
    click.option("--cache-type", "kv_type", type=KVCacheType(), default=None, metavar="f16|f32",
                 help="Element type of the attention K/V cache: f16 (llama.cpp's default) or f32 [default: f16]."),
    click.option("-ctk", "--cache-type-k", "cache_type_k", type=KVCacheType(), default=None, metavar="f16|f32",
                 help="llama.cpp's; K and V share one type here: the same as --cache-type."),
    click.option("-ctv", "--cache-type-v", "cache_type_v", type=KVCacheType(), default=None, metavar="f16|f32",
                 help="llama.cpp's; K and V share one type here: the same as --cache-type."),
    click.option("--backend", type=click.Choice(["auto", "cuda", "numpy"]), default="auto",
                 show_default=True, help="auto: cuda when a GPU is present, else numpy."),
    click.option("--devices", type=DeviceIds(), default=None,
                 help="Cards to run on; two or more split the layers (each layer's weights, KV and expert slots on "
                      "one card, each card with the --vram-budget); numpy emulates them, cuda: planned [default: 0]."),
)


# llama.cpp's placement flags, accepted so a llama.cpp command line runs, and answered with one stderr line: here
# the placement is fixed (attention and every tensor but the routed experts on the GPU, routed experts in host RAM
# behind the per-layer slot cache). Declared as whole names, so click matches "-ngl" before it tries "-n gl".
_LLAMA_PLACEMENT_OPTIONS = (
    click.option("-ngl", "--n-gpu-layers", "n_gpu_layers", default=None, metavar="N",
                 help="llama.cpp's; accepted and ignored: everything but the routed experts always lives on the GPU."),
    click.option("--n-cpu-moe", "n_cpu_moe", default=None, metavar="N",
                 help="llama.cpp's; accepted and ignored: routed experts live in host RAM behind the expert cache "
                      "(size it with --cache-slots)."),
    click.option("-ot", "--override-tensor", "override_tensor", multiple=True, metavar="PATTERN=TYPE",
                 help="llama.cpp's; accepted and ignored, like -ngl and --n-cpu-moe."),
    click.option("-ts", "--tensor-split", "tensor_split", default=None, metavar="N0,N1,...",
                 help="llama.cpp's; accepted and ignored: --devices splits whole layers, balanced by bytes."),
    click.option("-sm", "--split-mode", "split_mode", default=None, metavar="none|layer|row",
                 help="llama.cpp's; accepted and ignored: --devices always splits by layer."),
    click.option("-dev", "--device", "device", default=None, metavar="DEV0,DEV1",
                 help="llama.cpp's device names; accepted and ignored: name cards by id with --devices 0,1."),
    click.option("-b", "--batch-size", "batch_size", type=click.IntRange(min=1), default=None,
                 help="llama.cpp's logical batch; accepted and ignored: the runner's prompt batch is the "
                      "micro-batch (--ubatch/-ub, and --prefill-ubatch in the prefill phase)."),
)
_LLAMA_NAMES = ("n_gpu_layers", "n_cpu_moe", "override_tensor", "tensor_split", "split_mode", "device", "batch_size")

PLACEMENT_NOTE = ("note: -ngl, --n-cpu-moe and -ot are ignored: attention and everything but the routed experts "
                  "always live on the GPU, the routed experts in host RAM behind the per-layer expert cache; size it "
                  "with --cache-slots N|auto or a --profile")
SPLIT_NOTE = ("note: -ts, -sm and -dev are ignored: --devices 0,1 splits whole layers across cards (each layer's "
              "weights, KV cache and expert slots on one card), balanced by bytes against each card's --vram-budget")


def llama_flag_notes(given: dict[str, Any], ubatch: int | None) -> list[str]:
    """The stderr lines answering llama.cpp flags this runner accepts but does not follow (none when none given).
    -b is the logical batch in llama.cpp; here a prompt runs in micro-batches only, so -b says nothing unless it
    differs from -ub, which is then the one that counts."""
    notes = []
    if given["n_gpu_layers"] is not None or given["n_cpu_moe"] is not None or given["override_tensor"]:
        notes.append(PLACEMENT_NOTE)
    if any(given.get(k) is not None for k in ("tensor_split", "split_mode", "device")):
        notes.append(SPLIT_NOTE)
    if given["batch_size"] is not None and given["batch_size"] != ubatch:
        notes.append(f"note: -b {given['batch_size']} is ignored: the runner's prompt batch is the micro-batch "
                     f"(-ub/--ubatch{f', here {ubatch}' if ubatch is not None else ''})")
    return notes


def launch_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The launch flags shared by generate, chat, serve and profile, handed over as `launch: LaunchOptions`;
    llama.cpp's placement and batch flags are accepted and answered by one stderr line each (llama_flag_notes)."""
    from runner.launch.resolve import LaunchOptions

    names = [f.name for f in dataclasses.fields(LaunchOptions)]

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for note in llama_flag_notes({k: kwargs.pop(k) for k in _LLAMA_NAMES}, kwargs.get("ubatch")):
            click.echo(note, err=True)
        kwargs["kv_type"] = _one_kv_type(kwargs.pop("kv_type"), kwargs.pop("cache_type_k"), kwargs.pop("cache_type_v"))
        return fn(*args, launch=LaunchOptions(**{k: kwargs.pop(k) for k in names}), **kwargs)

    for option in reversed(_LAUNCH_OPTIONS + _LLAMA_PLACEMENT_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def _one_kv_type(both: str | None, k: str | None, v: str | None) -> str:
    """The K/V cache type from --cache-type, -ctk and -ctv (any of them, agreeing; none: the default)."""
    from runner.backends.kv_type import DEFAULT_KV_TYPE

    given = {flag: value for flag, value in (("--cache-type", both), ("-ctk", k), ("-ctv", v)) if value is not None}
    if len(set(given.values())) > 1:
        said = ", ".join(f"{flag} {value}" for flag, value in given.items())
        raise click.UsageError(f"{said}: K and V are cached in one type here; give one --cache-type f16|f32")
    return next(iter(given.values()), DEFAULT_KV_TYPE)


def model_option(required: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """-m/--model PATH, llama.cpp's way of naming the model, beside the positional MODEL; both given and
    different is one error line. `required`: one of the two must be given."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            flag, positional = kwargs.pop("model_flag"), kwargs.get("model")
            if flag is not None and positional is not None \
                    and os.path.abspath(flag) != os.path.abspath(positional):
                raise click.UsageError(f"two models given: MODEL {positional} and -m {flag}; give one")
            model = positional if positional is not None else flag
            if model is None and required:
                raise click.UsageError("missing the model: give MODEL or -m PATH")
            kwargs["model"] = model
            return fn(*args, **kwargs)

        return click.option("--model", "-m", "model_flag", default=None, type=click.Path(dir_okay=False),
                            metavar="PATH", help="The model (llama.cpp's spelling of MODEL).")(wrapper)

    return decorate


CHAT_TEMPLATE_MAX_BYTES = 1 << 20  # far past any real template (a few KiB to some tens of KiB)


def _read_template(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        data = read_small_file(value, CHAT_TEMPLATE_MAX_BYTES, "chat template file")
        text = data.decode("utf-8")
    except RunnerError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    except UnicodeDecodeError as exc:
        raise click.BadParameter(f"{value} is not valid UTF-8 (byte {exc.start})", ctx, param) from None
    return text


def chat_template_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--chat-template-file PATH: a jinja chat template used instead of the model file's, handed over as
    `chat_template: str | None` (the file's text)."""
    return click.option("--chat-template-file", "chat_template", default=None, type=click.Path(dir_okay=False),
                        callback=_read_template, metavar="PATH",
                        help="Jinja chat template to use instead of the model file's.")(fn)


class OneLineErrorsGroup(click.Group):
    """A group whose usage errors (a bad option value, a missing argument) are one `error: ...` line and exit
    code 1, like every other bad input, instead of click's usage block and exit code 2."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _usage_errors_in_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _usage_errors_in_one_line():  # a subcommand parses its options inside the group's invoke
            return super().invoke(ctx)


class OneLineUsageError(click.ClickException):
    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


@contextlib.contextmanager
def _usage_errors_in_one_line() -> Iterator[None]:
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise  # `runner` alone prints the help
    except click.UsageError as exc:
        where = f"; see '{exc.ctx.command_path} --help'" if exc.ctx is not None else ""
        message = " ".join(exc.format_message().split()).removesuffix(".")  # click's messages may span lines
        raise OneLineUsageError(message[:1].lower() + message[1:] + where) from None


def announce(launch: Any) -> None:
    """One stderr line saying how an offloaded or profiled launch was chosen and the context it runs with
    (silent when all is resident at the context asked for, or the model's)."""
    if launch.worth_announcing:
        click.echo(f"launch: {launch.summary()}", err=True)



def one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            # Weights holding NaN or infinity make numpy warn from deep inside a forward pass; generation
            # names non-finite logits itself, as the one error line.
            with np.errstate(all="ignore"):
                return fn(*args, **kwargs)
        except USER_ERRORS as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except BrokenPipeError:
            raise  # stdout closed early (`| head`): click exits quietly
        except OSError as exc:  # a path that cannot be written or read: missing folder, full disk, no permission
            where = f"{exc.filename}: " if exc.filename is not None else ""
            click.echo(f"error: {where}{exc.strerror or exc}", err=True)
            sys.exit(1)
        except MemoryError as exc:  # CuPy's pool refusing past the VRAM budget, or the host out of memory
            click.echo(f"error: out of memory: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


def read_small_file(path: str | Path, limit_bytes: int, what: str, error: type[RunnerError] = RunnerError) -> bytes:
    """The bytes of the regular file at `path` (`what`: "chat file"), at most `limit_bytes`; else one `error`.

    Opened without blocking and refused unless regular, so a FIFO cannot hang the caller and /dev/zero cannot
    fill its memory; the cap is read, not taken from st_size (which /proc files leave at 0)."""
    mib = f"{limit_bytes / 2**20:g} MiB"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise error(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"cannot read the {what} {path}: not a regular file (a {what} is one of at most {mib})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit_bytes + 1)
    except OSError as exc:
        raise error(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit_bytes:
        raise error(f"cannot read the {what} {path}: larger than the {mib} a {what} may have")
    return data


def default_model_path() -> Path:
    """The embedded default: the project's own trained demo model (glm4moe with a NextN block, Q5_K_S, 5.0 MiB)."""
    path = demo_model_path()
    if path is None:
        raise RunnerError("the embedded demo model (runner/data/demo.gguf) is missing; reinstall, or pass a MODEL.gguf")
    return path
