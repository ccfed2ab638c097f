"""A generation request from admission to HTTP response: one JSON body, or an SSE stream.

Nothing is sent until the first token exists, so a request the engine refuses still gets its
status code (400 etc.) rather than a broken stream. A client that goes away cancels its job:
while waiting or collecting we watch `receive()` for http.disconnect; once streaming,
Starlette's StreamingResponse notices the disconnect and cancels our generator.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Callable

from fastapi import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from runner.engine.generation import Step
from runner.errors import USER_ERRORS
from runner.server.errors import APIError, OpenAIJSONResponse, from_runner_error
from runner.server.formats import Format
from runner.server.worker import Event, Failed, Finished, GenerationSpec, Job, QueueFull, Scheduler, Started

log = logging.getLogger("runner.server")
CLIENT_CLOSED = 499  # nginx's status for "the client closed the request"; only ever seen in metrics


def _submit(scheduler: Scheduler, retry_after_s: int, spec: GenerationSpec) -> Job:
    job = Job(spec, asyncio.get_running_loop())
    try:
        scheduler.submit(job)
    except QueueFull:
        raise APIError(429, f"the server is busy: one request is running and {scheduler.queue_size} waiting; retry later",
                       code="queue_full", headers={"Retry-After": str(retry_after_s)}) from None
    return job


async def respond(request: Request, scheduler: Scheduler, retry_after_s: int, spec: GenerationSpec,
                  fmt: Format, stream: bool, include_usage: bool) -> Response:
    job = _submit(scheduler, retry_after_s, spec)
    watch = _DisconnectWatch(request.receive)
    try:
        if not stream:
            body = await _collect(job, fmt, watch, scheduler)
            return Response(status_code=CLIENT_CLOSED) if body is None else OpenAIJSONResponse(body)
        head = await _until_output(job, watch)
        if head is None:
            scheduler.cancel(job)
            return Response(status_code=CLIENT_CLOSED)
    except BaseException:
        scheduler.cancel(job)
        raise
    finally:
        watch.stop()  # before StreamingResponse starts its own receive() loop
    return _SSEResponse(_sse(job, head, fmt, include_usage), on_close=lambda: scheduler.cancel(job))


async def respond_each(request: Request, scheduler: Scheduler, retry_after_s: int,
                       work: list[tuple[GenerationSpec, Format]]) -> Response:
    """Several prompts of one request, generated one after another (each queued in turn): one body whose
    choices are indexed in prompt order and whose usage is their sum."""
    bodies: list[dict[str, Any]] = []
    for spec, fmt in work:
        job = _submit(scheduler, retry_after_s, spec)
        watch = _DisconnectWatch(request.receive)
        try:
            body = await _collect(job, fmt, watch, scheduler)
        except BaseException:
            scheduler.cancel(job)
            raise
        finally:
            watch.stop()
        if body is None:
            return Response(status_code=CLIENT_CLOSED)
        bodies.append(body)
    return OpenAIJSONResponse(_merged(bodies))


def _merged(bodies: list[dict[str, Any]]) -> dict[str, Any]:
    merged = {**bodies[0], "choices": [{**b["choices"][0], "index": i} for i, b in enumerate(bodies)]}
    usage = {k: sum(b["usage"][k] for b in bodies) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    usage["prompt_tokens_details"] = {"cached_tokens": sum(b["usage"]["prompt_tokens_details"]["cached_tokens"]
                                                           for b in bodies)}
    merged["usage"] = usage
    merged["timings"] = [b["timings"] for b in bodies]  # one per prompt: they ran one after another
    if "prompt_token_ids" in merged:
        merged["prompt_token_ids"] = [b["prompt_token_ids"] for b in bodies]
    return merged


class _DisconnectWatch:
    def __init__(self, receive: Receive) -> None:
        self.task = asyncio.ensure_future(self._wait(receive))

    @staticmethod
    async def _wait(receive: Receive) -> None:
        # The body is already read, so receive() now blocks until the client disconnects.
        while (await receive())["type"] != "http.disconnect":
            pass

    def stop(self) -> None:
        self.task.cancel()


async def _next(job: Job, watch: _DisconnectWatch) -> Event | None:
    """The job's next event, or None when the client disconnected first."""
    if not job.events.empty():
        return job.events.get_nowait()
    get = asyncio.ensure_future(job.events.get())
    await asyncio.wait({get, watch.task}, return_when=asyncio.FIRST_COMPLETED)
    if get.done():
        return get.result()
    get.cancel()
    return None


def _api_error(exc: Exception) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, USER_ERRORS):
        return from_runner_error(exc)
    log.error("generation failed", exc_info=exc)
    return APIError(500, f"internal error in the engine ({type(exc).__name__})")


async def _collect(job: Job, fmt: Format, watch: _DisconnectWatch, scheduler: Scheduler) -> dict[str, Any] | None:
    """The whole response body, or None when the client went away first."""
    queued_s, group, steps = 0.0, [], []
    while True:
        event = await _next(job, watch)
        if event is None:
            scheduler.cancel(job)
            return None
        if isinstance(event, Failed):
            raise _api_error(event.error)
        if isinstance(event, Started):
            queued_s = event.queued_s
        elif isinstance(event, Step):
            if event.token is not None:
                group.append(event)
                steps.append(event)
            if event.text:
                fmt.place(group, event.text)
                group = []
        elif isinstance(event, Finished):
            fmt.place(group, "")
            return fmt.response(steps, event.generation, queued_s)


async def _until_output(job: Job, watch: _DisconnectWatch) -> list[Event] | None:
    head: list[Event] = []
    while True:
        event = await _next(job, watch)
        if event is None:
            return None
        if isinstance(event, Failed):
            raise _api_error(event.error)
        head.append(event)
        if isinstance(event, (Step, Finished)):
            return head


async def _sse(job: Job, head: list[Event], fmt: Format, include_usage: bool) -> AsyncIterator[bytes]:
    for first in fmt.first_chunks():
        yield fmt.sse(first)
    queued_s, group = 0.0, []
    pending = list(head)
    while True:
        event = pending.pop(0) if pending else await job.events.get()
        if isinstance(event, Started):
            queued_s = event.queued_s
        elif isinstance(event, Step):
            if event.token is not None:
                group.append(event)
            if event.text:
                fmt.place(group, event.text)
                chunks = fmt.chunks(event.text, group)
                for chunk in chunks:
                    yield fmt.sse(chunk)
                if chunks:  # else the text is held back (a possible tag), and its tokens go with what follows
                    group = []
        else:
            if isinstance(event, Finished):
                fmt.place(group, "")
                for chunk in fmt.final_chunks(group, event.generation, queued_s):
                    yield fmt.sse(chunk)
                if include_usage:
                    yield fmt.sse(fmt.usage_chunk(event.generation))
            else:  # Failed after the stream began: the status is sent, so the error goes in-band
                yield fmt.sse_error(_api_error(event.error))
            yield fmt.sse_end()
            return


class _SSEResponse(StreamingResponse):
    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()  # a no-op after a normal end; stops the engine after a disconnect
