"""OpenAI-shaped errors: every failure becomes {"error": {message, type, param, code}} and a status."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from runner.engine.sampling import NonFiniteLogits
from runner.errors import USER_ERRORS, ServeError  # noqa: F401  (ServeError re-exported)

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
          429: "rate_limit_error", 503: "unavailable_error"}
# Anthropic's names for the same statuses; /v1/messages answers in its shape, {"type": "error", "error": ...}.
ANTHROPIC_PATH = "/v1/messages"
_ANTHROPIC_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every error (4xx, 5xx) has OpenAI's shape; a bad request body is a 400, never FastAPI's 422."""

    error: ErrorDetail


class APIError(Exception):
    """A request the server refuses; raised anywhere in a handler, rendered by `install_error_handlers`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        kind = _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        """Anthropic's shape, keeping OpenAI's param and code in the error object."""
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {**self.body()["error"], "type": kind}}

    def response(self, path: str | None = None) -> JSONResponse:
        """The error as JSON, in the shape of the API at `path`."""
        anthropic = path is not None and (path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/"))
        body = self.anthropic_body() if anthropic else self.body()
        return OpenAIJSONResponse(body, status_code=self.status, headers=self.headers)


def require_named_tool(name: str, tool_names: Any, param: str) -> None:
    """A forced tool_choice must name one of the request's tools (each API names the field its own way)."""
    if name not in set(tool_names):
        raise APIError(400, f"tool_choice names {name!r}, which is not among the tools", param=param)


def dump_json(content: Any) -> bytes:
    # Lone surrogates can arrive in request strings (JSON "\ud800") and be echoed in a message;
    # replacing them keeps the response valid UTF-8 instead of failing to encode.
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8", "replace")


class RefusedWhileReading(HTTPException):
    """An APIError raised while FastAPI reads a request body: it lets only an HTTPException through as it is."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.status, error.message, error.headers)
        self.error = error


class OpenAIJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return dump_json(content)


def from_runner_error(exc: Exception) -> APIError:
    """Engine and tokenizer errors are about the request as given (their messages are one line), except
    non-finite logits: the request was fine and the model file is not, so the server failed (500), and
    a client must not take it for its own mistake and "fix" the request (422 would say that)."""
    if isinstance(exc, NonFiniteLogits):
        return APIError(500, str(exc), code="non_finite_logits")
    return APIError(400, str(exc))


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = list(exc.errors())
    if not errors:
        return APIError(400, "the request is not valid")
    # Of a union's alternatives, a broken constraint (too long, too many, out of range) names what is
    # actually wrong, where the other alternatives only say "not a string"; then the deepest error.
    err = max(errors, key=lambda e: (not str(e.get("type", "")).endswith("_type"), len(e.get("loc", ()))))
    loc = [str(p) for p in err.get("loc", ())[1:] if not _is_union_tag(p)]  # drop the leading "body"
    if err.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {err.get('ctx', {}).get('error', 'decode error')}")
    if not loc and isinstance(err.get("input"), (bytes, str)):
        return APIError(400, "the request body must be a JSON object (send Content-Type: application/json)")
    if not loc:
        missing = err.get("type") == "missing"
        return APIError(400, "the request body is missing" if missing else f"the request body: {err.get('msg')}")
    param = ".".join(loc)
    return APIError(400, f"{param}: {err.get('msg')}", param=param)


def _is_union_tag(part: Any) -> bool:
    """pydantic names the alternative of a union an error is about ("str", "list[int]", "TextPart") in its location."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part
                                      or part.startswith("constrained-") or part[:1].isupper())


def install_error_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response(request.url.path)

    async def validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response(request.url.path)

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if isinstance(exc, RefusedWhileReading):
            return exc.error.response(request.url.path)
        message = exc.detail if isinstance(exc.detail, str) else "the request failed"
        return APIError(exc.status_code, message, headers=dict(exc.headers or {})).response(request.url.path)

    async def runner_error(request: Request, exc: Exception) -> JSONResponse:
        return from_runner_error(exc).response(request.url.path)

    async def internal(request: Request, exc: Exception) -> JSONResponse:
        # The traceback goes to the server log (Starlette re-raises), never into the response.
        return APIError(500, f"internal error ({type(exc).__name__})").response(request.url.path)

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(HTTPException, http_error)
    for error_type in USER_ERRORS:
        app.add_exception_handler(error_type, runner_error)
    app.add_exception_handler(Exception, internal)
