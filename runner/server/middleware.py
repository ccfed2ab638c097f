"""Pure ASGI middleware (no BaseHTTPMiddleware: it would get in the way of streaming and disconnects)."""

from __future__ import annotations

import hmac

from starlette.routing import Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runner.server.errors import APIError, RefusedWhileReading
from runner.server.metrics import Metrics


def endpoint_label(router: Router, scope: Scope) -> str:
    """The route's path template, so labels stay few whatever paths clients (or fuzzers) send."""
    for route in router.routes:
        match, _ = route.matches(scope)
        if match != Match.NONE:
            return getattr(route, "path", "other")
    return "other"


class CountRequests:
    """Counts each request by endpoint and status when its response starts (before the client sees it)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, router: Router) -> None:
        self.app, self.metrics, self.router = app, metrics, router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        endpoint, started = endpoint_label(self.router, scope), False

        async def counting_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except BaseException:
            if not started:  # Starlette's outer error middleware answers 500 for us
                self.metrics.requests.labels(endpoint, "500").inc()
            raise


class RequireAPIKey:
    """`Authorization: Bearer KEY` (or `X-Api-Key: KEY`, as Anthropic-style clients send it) on every path
    but the public ones, checked before the body is read."""

    def __init__(self, app: ASGIApp, api_key: str, public_paths: frozenset[str]) -> None:
        self.app, self.key, self.public = app, api_key.encode("utf-8"), public_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.public and not self._authorized(scope):
            error = APIError(401, "invalid or missing API key: send Authorization: Bearer KEY (or X-Api-Key: KEY)",
                             code="invalid_api_key",
                             headers={"WWW-Authenticate": "Bearer"})
            return await error.response(scope["path"])(scope, receive, send)
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope["headers"])
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        bearer = scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)
        return bearer or hmac.compare_digest(headers.get(b"x-api-key", b"").strip(), self.key)


class LimitBody:
    """A request body past `max_bytes` gets 413: at once when Content-Length says so (uvicorn then reads
    and drops the rest, within the body timeout), else as soon as the bytes received pass it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    def _too_large(self, size: str) -> APIError:
        mib = self.max_bytes / (1 << 20)
        return APIError(413, f"the request body ({size}) is larger than this server takes ({mib:g} MiB, "
                             "runner serve --max-body-mb)", code="request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large(f"{int(declared)} bytes").response(scope["path"])(scope, receive, send)
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise RefusedWhileReading(self._too_large(f"over {received} bytes"))
            return message

        await self.app(scope, counting_receive, send)
