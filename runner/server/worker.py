"""One worker thread owns the engine: generations run one at a time, in arrival order, from a bounded queue.

The engine is not thread-safe, so only this thread calls `generate` and iterates steps; events go
back to the asyncio loop that submitted the job. A cancelled job (its client went away) leaves the
queue at once, or, if running, stops after the token being decoded: closing the steps iterator.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Union

from runner.engine.generation import Generation, Step
from runner.engine.sampling import NonFiniteLogits, SamplingParams
from runner.offload.figures import counted_steps
from runner.server.errors import APIError
from runner.server.metrics import Metrics

log = logging.getLogger("runner.server")


@dataclass(frozen=True)
class GenerationSpec:
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    cache_prompt: bool = True  # False: reuse no cached KV (live or saved), so the whole prompt is prefilled


@dataclass(frozen=True)
class Started:
    generation: Generation
    queued_s: float


@dataclass(frozen=True)
class Finished:
    generation: Generation


@dataclass(frozen=True)
class Failed:
    error: Exception


Event = Union[Started, Step, Finished, Failed]


class QueueFull(Exception):
    pass


class Job:
    """A generation as the worker sees it; its events arrive on `events` in the submitting loop."""

    def __init__(self, spec: GenerationSpec, loop: asyncio.AbstractEventLoop) -> None:
        self.spec = spec
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.submitted_s = time.perf_counter()
        self._loop = loop

    def emit(self, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()


class Scheduler:
    def __init__(self, queue_size: int, metrics: Metrics, draft: Any = None) -> None:
        self.queue_size = queue_size
        self._metrics = metrics
        self._extra = {"draft": draft} if draft is not None else {}  # MTP drafting for every generation
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._engine: Any = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    @property
    def depth(self) -> int:
        return len(self._waiting)

    def attach(self, engine: Any) -> None:
        """Hand the engine to the worker thread (started here); jobs submitted before wait for it."""
        with self._cond:
            self._engine = engine
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="runner-engine", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise APIError(503, "the server is shutting down", code="shutting_down")
            busy = len(self._waiting) + (self._running is not None)
            if busy >= 1 + self.queue_size:
                raise QueueFull
            self._waiting.append(job)
            self._changed()

    def cancel(self, job: Job) -> None:
        job.cancelled.set()
        with self._cond:
            if job in self._waiting:
                self._waiting.remove(job)
                self._changed()

    def wait_until(self, predicate: Callable[["Scheduler"], bool], timeout_s: float) -> bool:
        """Block until `predicate(self)` holds after a queue change (or now); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self), timeout=timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            waiting, running = list(self._waiting), self._running
            self._waiting.clear()
            self._changed()
        for job in waiting:
            job.emit(Failed(APIError(503, "the server is shutting down", code="shutting_down")))
        if running is not None:
            running.cancelled.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _changed(self) -> None:  # holding the lock
        self._metrics.queue_depth.set(len(self._waiting))
        self._metrics.running.set(int(self._running is not None))
        self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or (self._waiting and self._engine is not None))
                if self._stopping:
                    return
                job = self._running = self._waiting.popleft()
                self._changed()
            try:
                self._run(job)
            finally:
                with self._cond:
                    self._running = None
                    self._changed()

    def _run(self, job: Job) -> None:
        spec = job.spec
        if job.cancelled.is_set():  # cancelled between leaving the queue and starting
            return
        try:
            gen = self._engine.generate(list(spec.prompt_tokens), spec.max_tokens, spec.sampling,
                                        stop=list(spec.stop), ignore_eos=spec.ignore_eos, logprobs=spec.logprobs,
                                        cancelled=job.cancelled.is_set, cache_prompt=spec.cache_prompt, **self._extra)
        except Exception as exc:
            job.emit(Failed(exc))
            return
        job.emit(Started(gen, time.perf_counter() - job.submitted_s))
        ttft_s: float | None = None
        failure: Exception | None = None
        steps = counted_steps(self._engine, gen)  # leaves this request's offload figures on gen.offload
        try:
            for step in steps:
                if ttft_s is None:
                    ttft_s = time.perf_counter() - job.submitted_s
                job.emit(step)
                if job.cancelled.is_set():
                    break
        except Exception as exc:
            failure = exc
        finally:
            steps.close()  # stops the engine after the current token when we broke out early
            self._metrics.record_generation(gen, ttft_s, job.cancelled.is_set())
        if isinstance(failure, NonFiniteLogits):
            # The model file's fault, not the request's: fail this request (500), log it, keep serving
            # (another prompt may not reach the broken weights), and keep no cached KV that may hold NaNs.
            self._metrics.non_finite.inc()
            log.warning("%s", failure)
            self._engine.rollback(0)
        # After the metrics, so a client that has its answer also sees them counted.
        job.emit(Failed(failure) if failure else Finished(gen))
