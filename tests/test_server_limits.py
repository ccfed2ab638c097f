"""What one client may hold: request bodies, connections, slow and half-closed clients, stop strings, and
long work kept off the event loop; plus the published schema saying what the server does. Connection
behaviour is tested over real sockets."""

from __future__ import annotations

import json
import logging
import queue
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from gguf_edit import rewrite_gguf
from test_server_harness import GatedEngine, assert_openai_error, serve_model

from runner.engine.engine import Engine, EngineConfig
from runner.engine.tokenizer import Tokenizer

WAIT_S = 30  # an upper bound on every wait below; each normally returns in milliseconds
LOOPS_FOREVER = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def model_path(synth_model):
    return synth_model("glm4moe")


@pytest.fixture(scope="module")
def engine(model_path):
    return Engine.load(model_path, EngineConfig(n_ctx=256))


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def connect(url: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port_of(url)), timeout=WAIT_S)


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(1 << 16):
        data += chunk
    return data


def request(path: str, body: dict[str, Any] | None = None, keep_alive: bool = True) -> bytes:
    raw = json.dumps(body).encode() if body is not None else b""
    method = "POST" if body is not None else "GET"
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(raw)}\r\n" + ("" if keep_alive else "Connection: close\r\n")
    return head.encode() + b"\r\n" + raw


def read_one(sock: socket.socket) -> tuple[int, bytes]:
    """The next response with a Content-Length on a kept-alive connection: its status and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(1 << 16)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(1 << 16)
    return int(head[9:12]), body


def final_response(data: bytes) -> tuple[int, bytes]:
    """The status and body of the last response in `data` (after any 1xx)."""
    head, _, body = data.rpartition(b"HTTP/1.1 ")[2].partition(b"\r\n\r\n")
    return int(head[:3]), body


@contextmanager
def warnings_of_uvicorn() -> Any:
    """The server's log lines (uvicorn's logger: it does not reach pytest's root handler)."""
    lines: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def healthy(url: str) -> bool:
    return httpx.get(f"{url}/health", timeout=WAIT_S).json() == {"status": "ok"}


# -- request bodies -----------------------------------------------------------------------------


def test_a_body_past_the_limit_is_413_however_it_arrives(model_path, engine) -> None:
    with serve_model(model_path, engine=engine, max_body_bytes=64 << 10) as (url, _):
        declared = httpx.post(f"{url}/tokenize", content=b'{"content": "' + b"x" * (1 << 20) + b'"}', timeout=WAIT_S)
        error = assert_openai_error(declared, 413)
        assert error["code"] == "request_too_large" and "0.0625 MiB, runner serve --max-body-mb" in error["message"]

        def chunks():  # no Content-Length: counted as it arrives
            yield b'{"content": "'
            for _ in range(40):
                yield b"x" * (4 << 10)
            yield b'"}'

        assert assert_openai_error(httpx.post(f"{url}/tokenize", content=chunks(), timeout=WAIT_S), 413)["code"] == \
            "request_too_large"
        with connect(url) as sock:  # refused on the header alone, before a byte of the body is sent
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
            status, body = read_one(sock)
        assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
        small = httpx.post(f"{url}/tokenize", json={"content": "x" * (60 << 10)}, timeout=WAIT_S)
        assert small.status_code == 200 and healthy(url)


# -- connections --------------------------------------------------------------------------------


def test_at_the_connection_cap_the_longest_idle_one_makes_room(model_path, engine) -> None:
    cap = 4
    with serve_model(model_path, engine=engine, max_connections=cap, keep_alive_s=60) as (url, _), \
            warnings_of_uvicorn() as log:
        idle = []
        for _ in range(cap):  # each answered once, then kept alive, idle
            sock = connect(url)
            sock.sendall(request("/health"))
            assert read_one(sock)[0] == 200
            idle.append(sock)
        assert healthy(url)  # a flood of idle sockets cannot keep /health out
        assert idle[0].recv(1) == b""  # the longest idle was closed for it
        assert any(line.startswith("closed an idle connection from 127.0.0.1:") and "4 open, the limit" in line
                   for line in log), log
        for sock in idle:
            sock.close()


def test_past_the_connection_cap_with_none_idle_a_connection_is_refused_in_one_line(model_path, engine) -> None:
    cap, gated = 4, GatedEngine(engine)
    with serve_model(model_path, engine=gated, max_connections=cap) as (url, app), \
            ThreadPoolExecutor(cap) as pool, warnings_of_uvicorn() as log:
        scheduler = app.state.runner.scheduler
        body = {"prompt": "hi", "max_tokens": 1}
        busy = [pool.submit(httpx.post, f"{url}/v1/completions", json=body, timeout=WAIT_S)]
        assert gated.entered.wait(WAIT_S)  # one running, then three waiting: every connection has a request
        busy += [pool.submit(httpx.post, f"{url}/v1/completions", json=body, timeout=WAIT_S) for _ in range(cap - 1)]
        assert scheduler.wait_until(lambda s: s.depth == cap - 1, WAIT_S)
        with connect(url) as extra:
            status, answer = final_response(read_all(extra))
        assert status == 503 and json.loads(answer)["error"]["code"] == "too_many_connections"
        assert any(line.startswith("refused a connection from 127.0.0.1:") and "4 open, the limit" in line
                   for line in log), log
        assert all("\n" not in line for line in log)
        gated.gate.set()
        assert [f.result(WAIT_S).status_code for f in busy] == [200] * cap
        assert healthy(url)


def test_idle_and_slow_clients_are_closed_with_408(model_path, engine) -> None:
    with serve_model(model_path, engine=engine, header_timeout_s=1, body_timeout_s=1, keep_alive_s=1) as (url, _), \
            warnings_of_uvicorn() as log:
        with connect(url) as idle:  # never sends a byte: closed, nothing said
            assert read_all(idle) == b""
        with connect(url) as trickle:
            trickle.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Le")
            status, body = final_response(read_all(trickle))
        assert status == 408 and "headers did not arrive within 1 s" in json.loads(body)["error"]["message"]
        with connect(url) as slow_body:
            slow_body.sendall(b'POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"content"')
            status, body = final_response(read_all(slow_body))
        assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout"
        with connect(url) as kept:  # answered, then closed once idle past keep-alive
            kept.sendall(request("/health"))
            assert final_response(read_all(kept))[0] == 200
        assert any("its request headers did not arrive within 1 s" in line for line in log), log
        assert healthy(url)


def test_a_client_that_half_closes_after_its_request_gets_the_answer(model_path, engine) -> None:
    with serve_model(model_path, engine=engine) as (url, _):
        for body in ({"prompt": "hello", "max_tokens": 3, "ignore_eos": True},
                     {"prompt": "hello", "max_tokens": 3, "ignore_eos": True, "stream": True}):
            with connect(url) as sock:
                sock.sendall(request("/v1/completions", body))
                sock.shutdown(socket.SHUT_WR)  # as `nc -N` does
                status, answer = final_response(read_all(sock))
            assert status == 200
            if body.get("stream"):
                assert b"data: [DONE]\n\n" in answer and answer.endswith(b"\r\n0\r\n\r\n")  # chunked, complete
            else:
                assert json.loads(answer)["usage"]["completion_tokens"] == 3
        assert healthy(url)


# -- stop strings, the schema, the API key -------------------------------------------------------


def test_stop_strings_are_capped_in_number_and_length(model_path, engine) -> None:
    with serve_model(model_path, engine=engine) as (url, _):
        def complete(stop):
            return httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stop": stop},
                              timeout=WAIT_S)

        assert complete(["s" * 256] * 16).status_code == 200
        assert complete("s" * 256).status_code == 200
        for too_much in (["s"] * 17, "s" * 257, ["s", "s" * 257]):
            assert assert_openai_error(complete(too_much), 400)["param"].startswith("stop")


def test_the_schema_needs_the_key_and_says_what_the_server_does(model_path, engine) -> None:
    with serve_model(model_path, engine=engine, api_key="sesame") as (url, _):
        assert_openai_error(httpx.get(f"{url}/openapi.json"), 401)
        assert httpx.get(f"{url}/docs").status_code in (401, 404)
        schema = httpx.get(f"{url}/openapi.json", headers={"Authorization": "Bearer sesame"}).json()
    assert "422" not in json.dumps(schema["paths"]) and "HTTPValidationError" not in schema["components"]["schemas"]
    for ops in schema["paths"].values():
        for op in ops.values():
            assert op["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert list(schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    assert "text/event-stream" in schema["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]
    parts = schema["components"]["schemas"]
    assert "tool" in parts["ChatMessage"]["properties"]["role"]["enum"]
    assert [(a.get("minLength"), a.get("minItems")) for a in parts["CompletionRequest"]["properties"]["prompt"]["anyOf"]] \
        == [(1, None), (None, 1), (None, 1), (None, 1)]
    stop = parts["CompletionRequest"]["properties"]["stop"]["anyOf"]
    assert stop[0]["maxLength"] == 256 and stop[1]["maxItems"] == 16


# -- long work off the event loop -----------------------------------------------------------------


class GatedTokenizer:
    """The engine's tokenizer, except that encode and render_chat wait for `gate`."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer, self.gate, self.entered = tokenizer, threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def _hold(self) -> None:
        self.entered.set()
        assert self.gate.wait(WAIT_S), "the test never opened the gate"

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        self._hold()
        return self._tokenizer.encode(*args, **kwargs)

    def render_chat(self, *args: Any, **kwargs: Any) -> str:
        self._hold()
        return self._tokenizer.render_chat(*args, **kwargs)


def test_templates_and_tokenization_run_off_the_event_loop(model_path) -> None:
    engine = Engine.load(model_path, EngineConfig(n_ctx=256))
    gated = engine.tokenizer = GatedTokenizer(engine.tokenizer)
    hi = [{"role": "user", "content": "hi"}]
    with serve_model(model_path, engine=engine) as (url, _), ThreadPoolExecutor(1) as pool:
        for path, body in (("/tokenize", {"content": "hi"}), ("/v1/completions", {"prompt": "hi", "max_tokens": 1}),
                           ("/v1/chat/completions", {"messages": hi, "max_tokens": 1})):
            gated.gate.clear()
            gated.entered.clear()
            pending = pool.submit(httpx.post, f"{url}{path}", json=body, timeout=WAIT_S)
            assert gated.entered.wait(WAIT_S)
            assert healthy(url)  # would time out if the encode or render held the event loop
            gated.gate.set()
            assert pending.result(WAIT_S).status_code == 200


def test_a_looping_template_fails_its_request_and_nothing_else(model_path) -> None:
    engine = Engine.load(model_path, EngineConfig(n_ctx=256))
    engine.tokenizer = Tokenizer(model_path, LOOPS_FOREVER)
    with serve_model(model_path, engine=engine) as (url, _), ThreadPoolExecutor(1) as pool:
        looping = pool.submit(httpx.post, f"{url}/v1/chat/completions", timeout=WAIT_S,
                              json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert healthy(url)
        other = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=WAIT_S)
        assert other.status_code == 200
        error = assert_openai_error(looping.result(WAIT_S), 400)
        assert "the chat template ran past its time limit (5 s)" in error["message"]
        assert healthy(url)


def test_serve_takes_max_body_mb_and_stops_on_sigterm_while_a_template_loops(model_path, tmp_path) -> None:
    looping = rewrite_gguf(model_path, tmp_path / "looping.gguf", metadata={"tokenizer.chat_template": LOOPS_FOREVER})
    code = "from runner.cli.serve import serve_command; serve_command(prog_name='runner serve')"
    proc = subprocess.Popen([sys.executable, "-c", code, str(looping), "--port", "0", "--max-body-mb", "1"],
                            stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    try:
        line = ""
        while "serving" not in line:
            line = lines.get(timeout=120)
        url = line.split(" on ", 1)[1].split()[0].removesuffix("/v1")
        too_big = httpx.post(f"{url}/tokenize", json={"content": "x" * (2 << 20)}, timeout=WAIT_S)
        assert "(1 MiB, runner serve --max-body-mb)" in assert_openai_error(too_big, 413)["message"]
        with connect(url) as chat:  # a render that runs into its time limit, in flight
            chat.sendall(request("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}))
            assert healthy(url)
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)  # raises if SIGTERM went unheard
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
