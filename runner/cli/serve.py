"""`runner serve`: bind first (a clear error if the port is taken), answer /health while the model loads."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from pathlib import Path
from typing import Any

import click

from runner.cli.support import (
    CTX_HELP,
    TEXT,
    announce,
    chat_template_option,
    default_model_path,
    launch_options,
    model_option,
    one_line_errors,
)
from runner.errors import ServeError
from runner.server.config import ServerConfig


def _listen(host: str, port: int) -> socket.socket:
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
    except OSError as exc:
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _finite(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if value != value:  # click's FloatRange lets NaN through: every comparison with it is false
        raise click.BadParameter(f"{value} is not a number", ctx, param)
    return value


class CacheRamGib(click.ParamType):
    """--cache-ram: GiB of host RAM for the prompt cache, 0 (off) to 1 PiB (float() alone takes 'nan')."""

    name = "GIB"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            gib = float(value)
        except ValueError:
            self.fail(f"{value!r} is not a number of GiB", param, ctx)
        if not 0 <= gib <= 1 << 20:  # nan fails too
            self.fail(f"{value} is not a number of GiB from 0 (off) to 1048576 (1 PiB)", param, ctx)
        return gib


def cache_ram_line(gib: float) -> str:
    """What the prompt cache may hold, said at start-up (llama-server's --cache-ram is MiB: say so when a
    value only makes sense as MiB)."""
    if gib == 0:
        return "prompt cache: off (--cache-ram 0)"
    line = f"prompt cache: up to {gib:g} GiB of host RAM for other conversations' KV (--cache-ram GIB; 0: off)"
    ram_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / (1 << 30)
    if gib > ram_gib:
        line += f"; note: that is more than this machine's {ram_gib:.0f} GiB (llama-server's --cache-ram is MiB)"
    return line


@click.command("serve")
@click.argument("model", required=False, type=click.Path(dir_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (only this machine by default).")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--api-key", default=None, type=TEXT,
              help="Require `Authorization: Bearer KEY` (or `X-Api-Key: KEY`) on every route but /health.")
@click.option("--cors", "cors_origins", multiple=True, type=TEXT, metavar="ORIGIN",
              help="Let web pages from ORIGIN (scheme://host[:port], or *) call the API; repeatable [default: none].")
@click.option("--n-ctx", "-c", "--ctx-size", "n_ctx", default=None, type=click.IntRange(min=1), help=CTX_HELP)
@click.option("--queue", "queue_size", default=8, show_default=True, type=click.IntRange(min=0),
              help="Requests that may wait behind the running one; beyond it, 429 with Retry-After.")
@click.option("--max-body-mb", default=8.0, show_default=True, type=click.FloatRange(min=0, max=1 << 20, min_open=True), callback=_finite,
              help="Largest request body in MiB; a larger one gets 413.")
@click.option("--alias", default=None, type=TEXT, metavar="NAME",
              help="The model id /v1/models lists and responses echo [default: the file's stem].")
@click.option("--cache-ram", "cache_ram_gib", default=8.0, show_default=True, type=CacheRamGib(),
              help="GiB of host RAM keeping other conversations' KV, so switching back does not re-prefill them "
                   "(least recently used dropped first); 0 turns it off.")
@click.option("--jinja", is_flag=True, help="llama.cpp's; accepted: chat templates are always rendered with jinja.")
@chat_template_option
@model_option()
@launch_options
@one_line_errors
def serve_command(model: str | None, host: str, port: int, api_key: str | None, cors_origins: tuple[str, ...],
                  n_ctx: int | None, queue_size: int, max_body_mb: float, alias: str | None, cache_ram_gib: float,
                  jinja: bool, chat_template: str | None, launch: Any) -> None:
    """Serve MODEL (default: the embedded tiny model) over an OpenAI-compatible HTTP API.

    A client may hold at most 256 connections at once (idle included); a request's headers must arrive
    within 10 s, its body within 60 s of them; idle connections close after 5 s.
    """
    import uvicorn

    from runner.cli.progress import arena_progress
    from runner.engine.engine import Engine
    from runner.gguf_file import open_gguf
    from runner.launch.resolve import resolve
    from runner.server.app import create_app
    from runner.server.connections import uvicorn_config

    path = Path(model) if model else default_model_path()
    model_file = open_gguf(path)  # a bad file fails here, before the port is bound
    plan = resolve(launch, model_file, n_ctx)  # so do contradicting launch flags
    announce(plan)
    model_id = alias if alias is not None else path.stem
    engine_config = dataclasses.replace(plan.engine_config(), prompt_cache_bytes=int(cache_ram_gib * (1 << 30)))
    ops = plan.make_ops()  # before binding: a missing GPU is a start-up error
    app = create_app(None, ServerConfig(model_id=model_id, api_key=api_key, cors_origins=cors_origins,
                                        queue_size=queue_size, draft=plan.draft if plan.draft.enabled else None,
                                        launch={**plan.to_dict(), "cache_ram_gib": cache_ram_gib},
                                        max_body_bytes=max(int(max_body_mb * (1 << 20)), 1)))
    sock = _listen(host, port)
    bound = sock.getsockname()
    server = uvicorn.Server(uvicorn_config(app))
    failure: list[BaseException] = []

    def load() -> None:
        try:
            with arena_progress() as arena:
                engine = Engine(model_file, engine_config, ops, chat_template=chat_template,
                                progress=lambda step: click.echo(f"loaded {step}", err=True), arena_progress=arena)
            app.state.runner.attach(engine)
            click.echo(cache_ram_line(cache_ram_gib), err=True)
            click.echo(f"serving {model_id} on http://{bound[0]}:{bound[1]}/v1 (context {engine.n_ctx})", err=True)
        except BaseException as exc:  # reported as one line after the server stops
            failure.append(exc)
            server.should_exit = True

    threading.Thread(target=load, name="runner-load", daemon=True).start()
    server.run(sockets=[sock])
    if failure:
        raise failure[0]
