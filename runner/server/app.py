"""The FastAPI app: OpenAI-compatible generation, models, health, metrics and llama.cpp's (de)tokenize."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from runner.server.anthropic import CountTokensRequest, MessagesFormat, MessagesRequest
from runner.server.config import ServerConfig
from runner.server.errors import APIError, ErrorBody, OpenAIJSONResponse, install_error_handlers
from runner.server.formats import ChatFormat, CompletionFormat, Format
from runner.server.metrics import Metrics
from runner.server.middleware import CountRequests, LimitBody, RequireAPIKey
from runner.server.plan import ChatPrompt, chat_prompt, completion_prompts, generation_spec, reply_syntax
from runner.server.respond import respond, respond_each
from runner.server.response_store import ResponseStore
from runner.server.responses import ResponsesRequest, list_page
from runner.server.responses_output import ResponsesFormat
from runner.server.schemas import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, HealthBody,
                                   TokenizeRequest)
from runner.server.structured import Grammars, requested_constraint
from runner.server.worker import Scheduler

PUBLIC_PATHS = frozenset({"/health"})  # /openapi.json too needs the key: it is every route's description


# Declaring the ranges keeps FastAPI from documenting its 422 (which this server never sends).
_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorBody, "description": "The request is refused (400, 401, 404, 408, 413, 429)"},
    "5XX": {"model": ErrorBody, "description": "The server failed (500: e.g. the model produced non-finite "
                                               "logits) or cannot serve now (503)"},
}

_STREAMED: dict[int | str, dict[str, Any]] = {
    200: {"description": "One JSON body, or with stream: true server-sent events ending in data: [DONE]",
          "content": {"text/event-stream": {"schema": {"type": "string"}}}},
}


class ServerState:
    """What the routes share: the engine (None while loading), its worker, health and metrics."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.scheduler = Scheduler(config.queue_size, self.metrics, config.draft)
        self.grammars = Grammars()  # structured output, compiled against the model's vocabulary
        self.responses = ResponseStore(config.stored_responses_bytes)  # the Responses API's `store`
        self.engine: Any = None
        self.unhealthy_reason: str | None = None
        self.created = int(time.time())

    def attach(self, engine: Any) -> None:
        self.engine = engine
        self.scheduler.attach(engine)

    def mark_unhealthy(self, reason: str) -> None:
        """For failures that leave the engine unusable (a failed phase transaction): refuse work until restart."""
        self.unhealthy_reason = reason

    def health(self) -> tuple[int, dict[str, str]]:
        if self.unhealthy_reason is not None:
            return 503, {"status": "unhealthy", "reason": self.unhealthy_reason}
        if self.engine is None:
            return 503, {"status": "loading", "reason": "the model is loading"}
        return 200, {"status": "ok"}

    def ready_engine(self) -> Any:
        status, body = self.health()
        if status != 200:
            raise APIError(503, f"the server is {body['status']}: {body['reason']}", code=body["status"])
        return self.engine

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.config.model_id:
            raise APIError(404, f"the model '{name}' does not exist; this server serves '{self.config.model_id}'",
                           param="model", code="model_not_found")

    def model_card(self) -> dict[str, Any]:
        return {"id": self.config.model_id, "object": "model", "created": self.created, "owned_by": "moe-offload-runner"}


def create_app(engine: Any, config: ServerConfig) -> FastAPI:
    """The app serving `engine`; pass None to start in the loading state, then `app.state.runner.attach(engine)`."""
    state = ServerState(config)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        state.scheduler.stop()

    app = FastAPI(title="moe-offload-runner", docs_url=None, redoc_url=None, lifespan=lifespan,
                  default_response_class=OpenAIJSONResponse, strict_content_type=False, responses=_ERROR_RESPONSES)
    app.state.runner = state
    install_error_handlers(app)
    app.add_middleware(LimitBody, max_bytes=config.max_body_bytes)  # inside the key check: no key, no reading
    if config.api_key is not None:
        app.add_middleware(RequireAPIKey, api_key=config.api_key, public_paths=PUBLIC_PATHS)
    if config.cors_origins:  # outside the key check: a browser's preflight carries no key, and a 401 needs the headers
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["*"], max_age=600)
    app.add_middleware(CountRequests, metrics=state.metrics, router=app.router)  # outermost: counts 401s too
    _add_routes(app, state)
    if engine is not None:
        state.attach(engine)
    return app


def _add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health", responses={200: {"model": HealthBody}, 503: {"model": HealthBody}})
    async def health() -> Response:
        status, body = state.health()
        return OpenAIJSONResponse(body, status_code=status)

    @app.get("/metrics", response_class=Response, responses={200: {
        "description": "Prometheus text exposition format", "content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/props")
    async def props() -> dict[str, Any]:
        """As llama.cpp's server: what this server runs with (launch settings, offload counters since load, a
        split's cards and transfers)."""
        engine = state.ready_engine()
        return {"model": state.config.model_id, "n_ctx": engine.n_ctx, "backend": engine.ops.name,
                "launch": state.config.launch, "offload": engine.stats() or None,
                "devices": engine.devices.stats() if engine.devices is not None else None}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [state.model_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        state.check_model(model)
        return state.model_card()

    # Templates and tokenization run in a worker thread: a long prompt (or a template that runs into
    # its time limit) must not hold the event loop, which answers /health and every other client.
    # `model` is not checked: as llama-server in single-model mode, whatever name a client was set up
    # with reaches the one model served.
    @app.post("/v1/chat/completions", responses=_STREAMED)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        logprobs = (body.top_logprobs or 0) if body.logprobs else None

        def chat_format(engine: Any, prompt: ChatPrompt) -> ChatFormat:
            return ChatFormat(state.config.model_id, engine.tokenizer, prompt.tokens, body.return_token_ids, logprobs,
                              reply=reply_syntax(body, engine.tokenizer.chat_template, prompt))

        return await _chat(request, body, logprobs, chat_format)

    # Anthropic's Messages and OpenAI's Responses APIs: the same chat path (template, tools, reply parsing),
    # their own formats.
    @app.post("/v1/messages", responses=_STREAMED)
    async def messages(body: MessagesRequest, request: Request) -> Response:
        chat = body.to_chat()
        return await _chat(request, chat, None, lambda engine, prompt: MessagesFormat(
            state.config.model_id, engine.tokenizer, prompt.tokens, stops=chat.stops(),
            reply=reply_syntax(chat, engine.tokenizer.chat_template, prompt)))

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest) -> dict[str, int]:
        """Anthropic's token count (Claude Code asks it): the prompt the template renders, tools included."""
        engine = state.ready_engine()
        prompt = await run_in_threadpool(chat_prompt, engine.tokenizer, body.to_chat())
        return {"input_tokens": len(prompt.tokens)}

    @app.post("/v1/responses", responses=_STREAMED)
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        conversation = body.conversation(state.responses)
        chat = body.to_chat(conversation)
        keep = None if body.store is False else lambda response: state.responses.put(response, conversation)
        return await _chat(request, chat, None, lambda engine, prompt: ResponsesFormat(
            state.config.model_id, engine.tokenizer, prompt.tokens, request=body, on_done=keep,
            reply=reply_syntax(chat, engine.tokenizer.chat_template, prompt)))

    @app.get("/v1/responses/{response_id}")
    async def stored_response(response_id: str) -> dict[str, Any]:
        return state.responses.get(response_id).response

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> dict[str, Any]:
        state.responses.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, limit: int = 20, order: str = "desc", after: str | None = None
                          ) -> dict[str, Any]:
        return list_page(state.responses.get(response_id).input_items, limit, order, after)

    async def _chat(request: Request, body: ChatCompletionRequest, logprobs: int | None,
                    make_format: Callable[[Any, ChatPrompt], Format]) -> Response:
        engine = state.ready_engine()
        prompt = await run_in_threadpool(chat_prompt, engine.tokenizer, body)
        constraint = requested_constraint(body, engine.tokenizer.chat_template)
        grammar = await run_in_threadpool(state.grammars.compile, engine.tokenizer, constraint)
        spec = generation_spec(body, prompt.tokens, engine.n_ctx, body.token_limit(), logprobs, "messages", grammar,
                               n_vocab=engine.tokenizer.n_vocab)
        return await _respond(request, body, spec, make_format(engine, prompt))

    @app.post("/v1/completions", responses=_STREAMED)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        engine = state.ready_engine()
        prompts = await run_in_threadpool(completion_prompts, engine.tokenizer, body)
        if len(prompts) > 1 and body.stream:
            raise APIError(400, "several prompts are answered only without streaming (stream: false)", param="prompt")
        constraint = requested_constraint(body, engine.tokenizer.chat_template)
        grammar = await run_in_threadpool(state.grammars.compile, engine.tokenizer, constraint)
        work = [(generation_spec(body, prompt, engine.n_ctx, body.token_limit(), body.logprobs, "prompt", grammar,
                                 n_vocab=engine.tokenizer.n_vocab),
                 CompletionFormat(state.config.model_id, engine.tokenizer, prompt, body.return_token_ids, body.logprobs))
                for prompt in prompts]  # every prompt checked before the first is queued
        if len(work) > 1:
            return await respond_each(request, state.scheduler, state.config.retry_after_s, work)
        return await _respond(request, body, *work[0])

    async def _respond(request: Request, body: Any, spec: Any, fmt: Any) -> Response:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await respond(request, state.scheduler, state.config.retry_after_s, spec, fmt, body.stream, include_usage)

    # Both answer with a response rendered in the worker thread: a list of millions of ids takes seconds to
    # turn into JSON.
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> Response:
        return await run_in_threadpool(_tokenize, state.ready_engine().tokenizer, body)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> Response:
        return await run_in_threadpool(_detokenize, state.ready_engine().tokenizer, body)


def _tokenize(tokenizer: Any, body: TokenizeRequest) -> Response:
    try:
        tokens = tokenizer.encode(body.content, add_special=body.add_special, parse_special=body.parse_special)
    except UnicodeEncodeError:
        raise APIError(400, "content is not valid Unicode (a lone surrogate?)", param="content") from None
    if not body.with_pieces:
        return OpenAIJSONResponse({"tokens": tokens})
    return OpenAIJSONResponse({"tokens": [{"id": t, "piece": _piece(_token_bytes(tokenizer, t))} for t in tokens]})


def _detokenize(tokenizer: Any, body: DetokenizeRequest) -> Response:
    raw = b"".join(_token_bytes(tokenizer, t) for t in body.tokens)
    return OpenAIJSONResponse({"content": raw.decode("utf-8", errors="replace")})


def _token_bytes(tokenizer: Any, token: int) -> bytes:
    # As llama.cpp's server, special tokens show as their text ("<|user|>") so /tokenize round-trips;
    # Tokenizer.decode drops them, as generated text should.
    return tokenizer.token_bytes(token) or tokenizer.token_text(token).encode("utf-8")


def _piece(raw: bytes) -> str | list[int]:
    # As llama.cpp's server: the text when the bytes are valid UTF-8 on their own, else the bytes.
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)
