"""What every command shares: one-line errors, the embedded default model."""

from __future__ import annotations

import os
import sys
from functools import wraps
from pathlib import Path
from typing import Any, Callable

import click

from .errors import RunnerError

def backend_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--backend and --vram-budget, shared by the commands that load a model."""
    fn = click.option("--vram-budget", "vram_budget", type=float, default=None,
                      help="GiB of device memory the cuda backend may use (default: all that is free).")(fn)
    return click.option("--backend", type=click.Choice(["auto", "cuda", "numpy"]), default="auto",
                        show_default=True, help="auto: cuda when a GPU is present, else numpy.")(fn)


DEFAULT_MODEL_SPEC = {"arch": "glm4moe", "preset": "tiny", "quant": "Q8_0", "seed": 0}


def one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RunnerError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except MemoryError as exc:  # CuPy's pool refusing past the VRAM budget, or the host out of memory
            click.echo(f"error: out of memory: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


def default_model_path() -> Path:
    """The embedded default: a tiny glm4moe the runner synthesizes into the user cache on first use."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moe-offload-runner"
    s = DEFAULT_MODEL_SPEC
    path = cache / f"default-{s['arch']}-{s['preset']}-{s['quant']}-seed{s['seed']}.gguf"
    if not path.exists():
        from .synth import synthesize

        cache.mkdir(parents=True, exist_ok=True)
        click.echo(f"synthesizing the default model into {path}", err=True)
        partial = path.with_suffix(".partial")
        synthesize(partial, s["arch"], s["preset"], s["quant"], s["seed"])
        partial.rename(path)
    return path
