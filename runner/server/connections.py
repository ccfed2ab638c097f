"""HTTP connections: uvicorn's h11 protocol with the limits a server on an open port needs.

- At most `max_connections` open at once, so idle or trickling clients cannot take every file
  descriptor (uvicorn's own limit_concurrency answers only once a request arrives, and keeps the
  connection meanwhile). At the limit a new connection closes the longest-idle one (no request in
  progress: a flood of idle sockets cannot keep /health out); with none idle it is answered 503.
- A request's headers must arrive within `header_timeout_s` of the connection (or of the request's
  first byte on a kept-alive one), its body within `body_timeout_s` of the headers; else 408 and close.
- A client that half-closes after its request (shutdown(SHUT_WR), as `nc -N` does) still gets its
  answer. From the server's side that looks like a client that closed and left, so a waiting request
  is sent "102 Processing" (HTTP/1.1 clients must accept a 1xx); a client that really left resets
  the connection on it, which cancels its job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from functools import partial
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from runner.server.config import ServerConfig
from runner.server.errors import APIError, dump_json

log = logging.getLogger("uvicorn.error")

PEER_CHECK_S = 0.5  # how often a half-closed connection's peer is checked while its answer is pending
MAX_HEADER_BYTES = 16 << 10  # request line and headers; more is a 400 from h11
# The listen queue, and how many connections asyncio accepts in one go before any of them reaches
# connection_made (and the cap): uvicorn's 2048 let a flood open 2048 descriptors at once.
ACCEPT_BACKLOG = 128


class Connections:
    """What the connections of one server share: which are idle, oldest first, and the log of refused,
    evicted and timed-out ones (one warning line each, at most one a second of a kind; the ones held
    back are counted in the next)."""

    def __init__(self) -> None:
        self.idle: dict[LimitedH11Protocol, None] = {}  # insertion-ordered: the longest idle first
        self._last_s: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def note(self, kind: str, line: str) -> None:
        now = time.monotonic()
        if now - self._last_s.get(kind, -1e9) < 1.0:
            self._held[kind] = self._held.get(kind, 0) + 1
            return
        held = self._held.pop(kind, 0)
        log.warning("%s%s", line, f" (and {held} more since the last such line)" if held else "")
        self._last_s[kind] = now


def _raw_response(error: APIError) -> bytes:
    """A whole HTTP/1.1 error response, written past h11 just before the connection closes."""
    body = dump_json(error.body())
    reason = {408: b"Request Timeout", 503: b"Service Unavailable"}.get(error.status, b"Error")
    head = [b"HTTP/1.1 %d %s" % (error.status, reason), b"content-type: application/json",
            b"content-length: %d" % len(body), b"connection: close"]
    head += [f"{k}: {v}".encode("latin-1") for k, v in error.headers.items()]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def _address(peer: Any) -> str:
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "a client"


class LimitedH11Protocol(H11Protocol):
    def __init__(self, config: uvicorn.Config, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None, *, limits: ServerConfig, shared: Connections) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits, self.shared = limits, shared
        self._refused = False
        self._phase: str | None = None  # "headers" or "body" while its deadline runs
        self._deadline: asyncio.TimerHandle | None = None
        self._partial = False  # some bytes of the request in the "headers" phase arrived
        self._half_closed = False
        self._peer_check: asyncio.TimerHandle | None = None

    # -- connections ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections and self.shared.idle:
            oldest = next(iter(self.shared.idle))
            self.shared.note("evicted", f"closed an idle connection from {_address(oldest.client)} to take one from "
                                        f"{_address(transport.get_extra_info('peername'))}: "
                                        f"{len(self.connections)} open, the limit")
            oldest.close_idle()
        elif len(self.connections) >= self.limits.max_connections:
            self._refused = True
            error = APIError(503, f"the server has {self.limits.max_connections} connections open, its limit; "
                                  "retry later", code="too_many_connections", headers={"Retry-After": "1"})
            transport.write(_raw_response(error))
            transport.close()
            self.shared.note("refused", f"refused a connection from {_address(transport.get_extra_info('peername'))}: "
                                        f"{len(self.connections)} open, the limit")
            return
        super().connection_made(transport)
        self._start("headers", self.limits.header_timeout_s)
        self.shared.idle[self] = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self.shared.idle.pop(self, None)
        self._stop()
        if self._peer_check is not None:
            self._peer_check.cancel()
        super().connection_lost(exc)

    def close_idle(self) -> None:
        self.shared.idle.pop(self, None)
        if not self.transport.is_closing():
            with contextlib.suppress(h11.LocalProtocolError):
                self.conn.send(h11.ConnectionClosed())
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE and not self.transport.is_closing():
            self.shared.idle[self] = None  # kept alive, waiting for its next request

    # -- request deadlines ----------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self.shared.idle.pop(self, None)
        if self._phase is None and self.conn.their_state is h11.IDLE:  # a new request on a kept-alive connection
            self._start("headers", self.limits.header_timeout_s)
        self._partial = True
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._phase != "body":
                self._start("body", self.limits.body_timeout_s)
        elif state is not h11.IDLE or self._phase == "body":  # headers and body in; or the request is over
            self._stop()

    def _start(self, phase: str, timeout_s: float) -> None:
        self._stop()
        self._phase, self._partial = phase, False
        self._deadline = self.loop.call_later(timeout_s, self._expired)

    def _stop(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._phase, self._deadline = None, None

    def _expired(self) -> None:
        phase, self._phase, self._deadline = self._phase, None, None
        timeout_s = self.limits.header_timeout_s if phase == "headers" else self.limits.body_timeout_s
        if self.transport.is_closing():
            return
        what = "request headers" if phase == "headers" else "request body"
        if phase == "body" or self._partial:
            self.shared.note("timeout", f"closed a connection from {_address(self.client)}: its {what} did not "
                                        f"arrive within {timeout_s:g} s")
            if self.cycle is not None and not self.cycle.response_started:
                self.cycle.disconnected = True  # the app waiting for the body sees a disconnect; it answers no one
                self.cycle.message_event.set()
            if self.cycle is None or not self.cycle.response_started:
                self.transport.write(_raw_response(APIError(408, f"the {what} did not arrive within {timeout_s:g} s",
                                                            code="request_timeout")))
        self.transport.close()

    # -- half-close -----------------------------------------------------------------------------
    def eof_received(self) -> bool | None:
        cycle = self.cycle
        if self._half_closed:
            return True
        if cycle is None or cycle.response_complete or self.conn.their_state is not h11.DONE:
            return None  # no whole request waiting for its answer: close, as uvicorn does
        self._half_closed = True
        cycle.keep_alive = False  # close once answered
        if not cycle.response_started and self.scope["http_version"] == "1.1":
            try:
                self.transport.write(self.conn.send(h11.InformationalResponse(status_code=102, headers=[],
                                                                              reason=b"Processing")))
            except h11.LocalProtocolError:
                return None
            self._peer_check = self.loop.call_later(PEER_CHECK_S, self._check_peer)
        return True  # keep writing: the answer still goes out

    def _check_peer(self) -> None:
        """A client that closed (rather than half-closed) resets the connection on the 102: abort, so the
        app sees the disconnect and cancels the job."""
        self._peer_check = None
        if self.transport.is_closing() or self.cycle is None or self.cycle.response_complete:
            return
        sock = self.transport.get_extra_info("socket")
        try:
            gone = sock is not None and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0
        except OSError:
            gone = True
        if gone:
            self.transport.abort()
        else:
            self._peer_check = self.loop.call_later(PEER_CHECK_S, self._check_peer)


def uvicorn_config(app: Any, log_level: str = "info") -> uvicorn.Config:
    """uvicorn's settings for `app` (made by create_app), with the limits of its ServerConfig."""
    limits: ServerConfig = app.state.runner.config
    return uvicorn.Config(
        app, log_level=log_level, timeout_graceful_shutdown=5,
        http=partial(LimitedH11Protocol, limits=limits, shared=Connections()),  # type: ignore[arg-type]
        timeout_keep_alive=limits.keep_alive_s, h11_max_incomplete_event_size=MAX_HEADER_BYTES, backlog=ACCEPT_BACKLOG,
        # uvicorn answers 503 past this many connections or requests in flight. Connections never get
        # there (capped at accept, one more for a moment while an idle one is evicted), so what it bounds
        # is requests left running by clients that already closed (a long template render, say).
        limit_concurrency=2 * limits.max_connections,
    )
