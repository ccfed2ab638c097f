"""Prometheus metrics of one app, in its own registry (two apps in one process never share counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from runner.engine.generation import Generation

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("runner_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("runner_prompt_tokens", "Prompt tokens of generations run", registry=r)
        self.cached_prompt_tokens = Counter("runner_cached_prompt_tokens", "Prompt tokens whose KV was reused", registry=r)
        self.restored_prompt_tokens = Counter("runner_restored_prompt_tokens", "Of the reused prompt tokens, those "
                                              "restored from the host-RAM prompt cache (--cache-ram)", registry=r)
        self.completion_tokens = Counter("runner_completion_tokens", "Tokens generated", registry=r)
        self.non_finite = Counter("runner_non_finite_logits", "Generations failed because the model produced NaN or "
                                  "infinite logits (its weights or metadata are broken)", registry=r)
        self.cancelled = Counter("runner_generations_cancelled", "Generations stopped because the client went away", registry=r)
        self.ttft = Histogram("runner_time_to_first_token_seconds",
                              "From admission (queue wait included) to the first generated token", buckets=_SECONDS, registry=r)
        self.prefill = Histogram("runner_prefill_seconds", "Prefill time per generation", buckets=_SECONDS, registry=r)
        self.decode = Histogram("runner_decode_seconds", "Decode time per generation", buckets=_SECONDS, registry=r)
        self.queue_depth = Gauge("runner_queue_depth", "Requests waiting for the engine", registry=r)
        self.running = Gauge("runner_requests_running", "Generations running (0 or 1)", registry=r)
        self.generations = Counter("runner_generations", "Generations run (finished, stopped or failed); a metrics "
                                   "delta belongs to one request only when this moved by exactly one", registry=r)
        # Expert offload (all 0 when every expert is resident) and MTP drafting.
        self.phase_begin = Counter("runner_phase_begin", "Prefill phase transactions begun", registry=r)
        self.phase_end = Counter("runner_phase_end", "Prefill phase transactions ended", registry=r)
        self.phase_failure = Counter("runner_phase_failure", "Prefill phase transactions failed", registry=r)
        self.cache_hits = Counter("runner_expert_cache_hits", "Expert cache hits", registry=r)
        self.cache_misses = Counter("runner_expert_cache_misses", "Expert cache misses", registry=r)
        self.bytes_uploaded = Counter("runner_expert_bytes_uploaded", "Expert bytes copied host to device", registry=r)
        self.prefill_bytes = Counter("runner_prefill_expert_bytes", "Expert bytes streamed by prefill", registry=r)
        self.phase_release = Histogram("runner_phase_release_seconds", "Prefill phase: quiesce to buffers reserved",
                                       buckets=_SECONDS, registry=r)
        self.phase_restore = Histogram("runner_phase_restore_seconds", "Prefill phase: buffers freed to end",
                                       buckets=_SECONDS, registry=r)
        self.drafted = Counter("runner_draft_tokens", "MTP tokens drafted", registry=r)
        self.accepted = Counter("runner_draft_tokens_accepted", "MTP drafted tokens accepted", registry=r)

    def record_generation(self, gen: Generation, ttft_s: float | None, cancelled: bool) -> None:
        self.prompt_tokens.inc(gen.prompt_tokens)
        self.cached_prompt_tokens.inc(gen.cached_tokens)
        self.restored_prompt_tokens.inc(gen.restored_tokens)
        self.completion_tokens.inc(len(gen.tokens))
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        self.prefill.observe(gen.prefill_s)
        self.decode.observe(gen.decode_s)
        if cancelled:
            self.cancelled.inc()
        if gen.draft is not None:
            self.drafted.inc(gen.draft.drafted_n)
            self.accepted.inc(gen.draft.accepted_n)
        if gen.offload is not None:
            self._record_offload(gen.offload)
        self.generations.inc()  # last: a scraper that sees it moved sees every figure above too

    def _record_offload(self, f: dict) -> None:
        self.cache_hits.inc(f["cache_hits"])
        self.cache_misses.inc(f["cache_misses"])
        self.bytes_uploaded.inc(f["bytes_uploaded"])
        self.prefill_bytes.inc(f["prefill_bytes"])
        self.phase_begin.inc(f["phase_begins"])
        self.phase_end.inc(f["phase_ends"])
        self.phase_failure.inc(f["phase_failures"])
        if f["phase_release_s"] is not None:
            self.phase_release.observe(f["phase_release_s"])
            self.phase_restore.observe(f["phase_restore_s"])

    def render(self) -> bytes:
        return generate_latest(self.registry)
