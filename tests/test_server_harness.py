"""Helpers for the server tests (no tests here): a real uvicorn server on 127.0.0.1, metrics parsing,
and the real engine behind a gate so queue tests control exactly when generations start."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from runner.engine.engine import Engine, EngineConfig
from runner.server import ServerConfig, create_app, uvicorn_config


@contextmanager
def live_server(app: Any) -> Iterator[str]:
    """Serve `app` on a free 127.0.0.1 port in a background thread, with the limits `runner serve` sets
    (its ServerConfig's); yields the base URL."""
    # The socket is bound and listening before the thread starts, so connections made at once wait
    # in the backlog until uvicorn accepts them: nothing to poll for.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn_config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
        assert not thread.is_alive(), "the server did not shut down"


@contextmanager
def serve_model(path: Any, n_ctx: int = 4096, engine: Any = None, **config: Any) -> Iterator[tuple[str, Any]]:
    """A live server over the model at `path` (or `engine`); yields (base URL, app)."""
    engine = engine or Engine.load(path, EngineConfig(n_ctx=n_ctx))
    app = create_app(engine, ServerConfig(model_id=path.stem, **config))
    with live_server(app) as url:
        yield url, app


def openai_client(url: str, api_key: str = "unused") -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=60)


def metric_samples(url: str, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics as {(name, sorted labels): value}."""
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


class GatedEngine:
    """The real engine, except that each generate() records its prompt and waits for `gate`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.prompts: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, prompt_tokens: list[int], *args: Any, **kwargs: Any) -> Any:
        self.prompts.append(list(prompt_tokens))
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return self._engine.generate(prompt_tokens, *args, **kwargs)
