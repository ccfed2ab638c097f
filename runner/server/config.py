"""What the server is told at start-up, validated once."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from runner.errors import ServeError

_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s?#]+")  # what a browser sends in Origin: scheme, host, port


@dataclass(frozen=True)
class ServerConfig:
    model_id: str  # the GGUF file's stem: what /v1/models lists and requests must name
    api_key: str | None = None  # when set, every route but /health needs `Authorization: Bearer KEY` or `X-Api-Key`
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call (CORS); none: no CORS headers at all
    queue_size: int = 8  # requests that may wait behind the running one; more get 429
    retry_after_s: int = 1  # what a 429 asks the client to wait
    draft: Any = None  # a spec.config.DraftConfig every generation uses; None: plain decoding
    launch: dict[str, Any] = field(default_factory=dict)  # the resolved launch settings, shown by GET /props
    # What one client may hold (runner/server/connections.py, middleware.py): a body larger than any
    # context this runner serves (8 MiB of text is about 2M tokens), connections well under the usual
    # 1024 file descriptors, and timeouts no working client comes near.
    max_body_bytes: int = 8 << 20  # a larger request body gets 413
    max_connections: int = 256  # open at once, idle ones included; one more is answered 503 and closed
    header_timeout_s: float = 10.0  # from a connection (or a request's first byte) to its complete headers
    body_timeout_s: float = 60.0  # from a request's headers to the end of its body
    keep_alive_s: int = 5  # an idle connection between requests is closed after this
    stored_responses_bytes: int = 64 << 20  # the Responses API's stored responses (JSON); least recently used go

    def __post_init__(self) -> None:
        if not self.model_id:
            raise ServeError("the model id is empty")
        if self.queue_size < 0 or self.retry_after_s < 0:
            raise ServeError(f"queue_size ({self.queue_size}) and retry_after_s ({self.retry_after_s}) must be >= 0")
        if self.api_key is not None and not self.api_key.strip():
            raise ServeError("the API key is empty")
        for origin in self.cors_origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ServeError(f"--cors {origin!r} is not an origin: give scheme://host[:port] (no path) or *")
        for name in ("max_body_bytes", "max_connections", "header_timeout_s", "body_timeout_s", "keep_alive_s",
                     "stored_responses_bytes"):
            if not getattr(self, name) > 0:
                raise ServeError(f"{name} must be > 0, got {getattr(self, name)}")
