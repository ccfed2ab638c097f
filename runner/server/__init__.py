"""`runner serve`: a single-user OpenAI-compatible HTTP server over one engine.

Names are imported on first use so that `runner --help` and the other commands do not pay for
importing FastAPI.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {"create_app": "app", "ServerConfig": "config", "uvicorn_config": "connections",
            "APIError": "errors", "ServeError": "errors"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'runner.server' has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
