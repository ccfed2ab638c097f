"""`runner chat`: a terminal chat on the model's own template; replies stream, Ctrl-C stops one reply."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any, Callable

import click

from runner.cli.chat_session import ChatSession, ChatSettings, ChatTotals, TurnStats
from runner.cli.support import (
    CTX_HELP,
    SEED,
    TEXT,
    announce,
    chat_template_option,
    default_model_path,
    launch_options,
    model_option,
    not_utf8,
    one_line_errors,
)
from runner.errors import USER_ERRORS, ChatError
from runner.offload.figures import describe_totals

PROMPT = ">>> "
HELP = """\
/help           this list
/reset          forget the conversation (keeps the system prompt and the totals)
/system [TEXT]  show the system prompt, or set it to TEXT
/stats          totals for this session and figures of the last turn
/save FILE      write the conversation (system, messages, settings) as JSON
/load FILE      replace the conversation and settings with a saved one
/exit           quit (so does Ctrl-D); Ctrl-C stops a reply or clears the line"""

# A random-weight model can emit any byte; keep escape and control codes off the terminal.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@click.command("chat")
@click.argument("model", required=False, type=click.Path(dir_okay=False))
@click.option("--system", default=None, type=TEXT, help="System prompt.")
@click.option("--temperature", default=0.8, show_default=True, type=click.FloatRange(min=0), help="0 means greedy.")
@click.option("--seed", default=None, type=SEED, help="Sampling seed, offset by the turn number (default: random).")
@click.option("--max-tokens", "-n", "--n-predict", "max_tokens", default=512, show_default=True, type=click.IntRange(min=1),
              help="Most tokens per reply.")
@click.option("--n-ctx", "-c", "--ctx-size", "n_ctx", default=None, type=click.IntRange(min=1), help=CTX_HELP)
@chat_template_option
@model_option()
@launch_options
@one_line_errors
def chat_command(model: str | None, system: str | None, temperature: float, seed: int | None, max_tokens: int,
                 n_ctx: int | None, chat_template: str | None, launch: Any) -> None:
    """Chat with MODEL (default: the embedded tiny model) in the terminal."""
    from runner.gguf_file import open_gguf
    from runner.launch.resolve import resolve

    settings = ChatSettings(temperature=temperature, seed=seed, max_tokens=max_tokens)
    path = str(model or default_model_path())
    model_file = open_gguf(path)
    plan = resolve(launch, model_file, n_ctx)
    announce(plan)
    engine = _load(model_file, plan.engine_config(), plan.make_ops(), chat_template)
    session = ChatSession(engine, settings, system, draft=plan.draft)
    _undecodable_lines_kept()
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (input() then gets line editing and history)
    click.echo(f"{engine.tokenizer.name}: {engine.model_config.arch}, context {engine.n_ctx} tokens. "
               "/help lists commands, Ctrl-D quits.", err=True)
    repl(session)


def _load(model_file: Any, config: Any, ops: Any, chat_template: str | None = None) -> Any:
    from runner.cli.progress import arena_progress
    from runner.engine.engine import Engine

    with arena_progress() as arena, click.progressbar(length=len(Engine.LOAD_STEPS), file=sys.stderr,
                                                      label=f"loading {os.path.basename(model_file.path)}",
                                                      item_show_func=lambda s: s) as bar:
        return Engine(model_file, config, ops, progress=lambda step: bar.update(1, step), chat_template=chat_template,
                      arena_progress=arena)


def _undecodable_lines_kept() -> None:
    """Bytes that are not UTF-8 (a terminal set to another encoding, a pasted binary) reach the REPL as lone
    surrogates instead of raising in input() and ending the session; repl() refuses such a line."""
    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="surrogateescape")  # input() decodes readline's bytes with these errors too


def repl(session: ChatSession) -> None:
    """Read lines until Ctrl-D or /exit; a runner error is one line and the session goes on."""
    while True:
        try:
            line = input(PROMPT).strip()
            _check_text(line)
            if line.startswith("/"):
                if not command(session, line):
                    return
            elif line:
                turn(session, line)
        except EOFError:
            click.echo()
            return
        except KeyboardInterrupt:  # at the prompt: drop the line, ask again
            click.echo()
        except USER_ERRORS as exc:
            click.echo(f"error: {exc}", err=True)


def _check_text(line: str) -> None:
    """A line that is not UTF-8 is refused whole, so the model never sees a guess at what was meant; only a
    /save or /load path may hold such bytes (a file name is bytes)."""
    problem = not_utf8(line)
    if problem and not line.startswith(("/save ", "/load ")):
        raise ChatError(f"the line is {problem} and was not sent; is the terminal set to UTF-8?")


def turn(session: ChatSession, text: str) -> None:
    with _sigint_flag() as stopped:
        stats = session.chat(text, on_text=lambda s: click.echo(_CONTROL.sub("\ufffd", s), nl=False),
                             should_stop=stopped.is_set)
    click.echo()
    _note(summary(stats))
    if stats.context_full:
        _note("the context is full: /reset to start over")


@contextlib.contextmanager
def _sigint_flag() -> Iterator[threading.Event]:
    """Ctrl-C sets a flag instead of raising, so a reply ends between tokens, never inside a forward pass."""
    flag = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def command(session: ChatSession, line: str) -> bool:
    """Run one /command; False means quit."""
    name, _, arg = line.partition(" ")
    arg = arg.strip()
    handler = _COMMANDS.get(name)
    if handler is None:
        click.echo(f"unknown command {name}; /help lists the commands", err=True)
        return True
    if name in ("/save", "/load"):
        arg = _one_path(name, arg)
        if arg is None:
            return True
    return handler(session, arg) is not False


def _one_path(name: str, arg: str) -> str | None:
    try:
        words = shlex.split(arg)
    except ValueError:
        words = []
    if len(words) != 1:
        click.echo(f"usage: {name} FILE", err=True)
        return None
    return os.path.expanduser(words[0])


def _system(session: ChatSession, text: str) -> None:
    if text:
        session.system = text
        click.echo("system prompt set", err=True)
    else:
        click.echo(f"system prompt: {session.system!r}" if session.system is not None else "no system prompt",
                   err=True)


def _reset(session: ChatSession, _: str) -> None:
    session.reset()
    click.echo("conversation cleared", err=True)


def _save(session: ChatSession, path: str) -> None:
    session.save(path)
    click.echo(f"saved {len(session.messages)} messages to {path}", err=True)


def _load_file(session: ChatSession, path: str) -> None:
    session.load(path)
    s = session.settings
    click.echo(f"loaded {len(session.messages)} messages from {path} (temperature {s.temperature}, "
               f"seed {s.seed}, max tokens {s.max_tokens})", err=True)


_COMMANDS: dict[str, Callable[[ChatSession, str], Any]] = {
    "/help": lambda session, _: click.echo(HELP, err=True),
    "/exit": lambda session, _: False,
    "/reset": _reset,
    "/system": _system,
    "/stats": lambda session, _: click.echo(stats_text(session), err=True),
    "/save": _save,
    "/load": _load_file,
}


# -- figures ------------------------------------------------------------------------------------
def summary(t: TurnStats) -> str:
    """One line per reply; the optional figures appear once a backend measures them."""
    parts = [f"{t.prompt_tokens} prompt tokens: {t.new_tokens} new, {t.cached_tokens} cached, "
             f"{t.prefill_tok_s:.1f} tok/s prefill",
             f"{t.completion_tokens} generated, {t.decode_tok_s:.1f} tok/s decode"]
    if t.draft_acceptance is not None:
        parts.append(f"draft acceptance {t.draft_acceptance:.0%}")
    if t.cache_hit_rate is not None:
        parts.append(f"expert cache hits {t.cache_hit_rate:.0%}")
    if t.pcie_bytes is not None:
        parts.append(f"PCIe {t.pcie_bytes / 2**20:.1f} MiB")
    parts.append(f"finish: {t.finish_reason}")
    return "[" + " | ".join(parts) + "]"


def stats_text(session: ChatSession) -> str:
    c: ChatTotals = session.totals
    reused = f"{c.cached_tokens / c.prompt_tokens:.0%}" if c.prompt_tokens else "0%"
    lines = [f"turns: {c.turns} ({c.interrupted} interrupted), {len(session.messages)} messages in the conversation",
             f"prompt tokens: {c.prompt_tokens} ({c.prompt_tokens - c.cached_tokens} new, {c.cached_tokens} cached, "
             f"{reused} reused), prefill {c.prefill_s:.2f} s, {c.prefill_tok_s:.1f} tok/s",
             f"generated tokens: {c.completion_tokens}, decode {c.decode_s:.2f} s, {c.decode_tok_s:.1f} tok/s",
             f"context: {len(session.engine.kv_tokens)} of {session.engine.n_ctx} tokens cached",
             *describe_totals(session.engine.stats()),
             f"last turn: {summary(session.last) if session.last else 'none yet'}"]
    return "\n".join(lines)


def _note(text: str) -> None:
    sys.stdout.flush()
    color = sys.stderr.isatty() and os.environ.get("TERM", "dumb") != "dumb" and "NO_COLOR" not in os.environ
    click.echo(click.style(text, dim=True) if color else text, err=True, color=color)
