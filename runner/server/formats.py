"""Response and stream-chunk bodies of the two OpenAI endpoints, from the engine's steps.

Steps are grouped: tokens whose text the engine holds back (part of a UTF-8 character or of a
possible stop string) travel with the chunk that finally carries text, or with the final chunk,
so every token id is reported exactly once (MEASURING.md: count tokens, not events).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from runner.engine.generation import Generation, Step
from runner.engine.tokenizer import Tokenizer
from runner.server.errors import APIError, dump_json
from runner.server.reply import Part, ReplySyntax, whole_reply


def usage(gen: Generation) -> dict[str, Any]:
    return {"prompt_tokens": gen.prompt_tokens, "completion_tokens": len(gen.tokens),
            "total_tokens": gen.prompt_tokens + len(gen.tokens),
            "prompt_tokens_details": {"cached_tokens": gen.cached_tokens}}


def timings(gen: Generation, queued_s: float) -> dict[str, Any]:
    """llama.cpp-style: prompt_n counts the tokens prefilled, cache_n (llama-server's name; cached_n as
    before) those reused, from the live KV cache or restored from the prompt cache in host RAM
    (cache_restored_n of them)."""
    t = gen.timings()
    return {
        "prompt_n": gen.prompt_tokens - gen.cached_tokens, "prompt_ms": t["prefill_s"] * 1e3,
        "prompt_per_second": t["prefill_tok_s"], "cache_n": gen.cached_tokens, "cached_n": gen.cached_tokens,
        "cache_restored_n": gen.restored_tokens,
        "predicted_n": len(gen.tokens), "predicted_ms": t["decode_s"] * 1e3,
        "predicted_per_second": t["decode_tok_s"], "queue_ms": queued_s * 1e3,
        # MTP drafts (0 without --draft mtp) and this request's expert offload figures (0 when every expert
        # is resident): bytes_uploaded is every host-to-device expert byte (prefill stream, misses, warm refill).
        "drafted_n": t.get("drafted_n", 0), "accepted_n": t.get("accepted_n", 0),
        "cache_hits": t.get("cache_hits", 0), "cache_misses": t.get("cache_misses", 0),
        "bytes_uploaded": t.get("bytes_uploaded", 0), "prefill_bytes": t.get("prefill_bytes", 0),
        "prefill_expert_sets": t.get("prefill_expert_sets", 0.0),
    }


class Format:
    """A response's bodies and stream events, built from the engine's steps; subclasses per endpoint."""

    prefix = ""
    object_name = ""

    def __init__(self, model: str, tokenizer: Tokenizer, prompt_tokens: list[int], return_token_ids: bool,
                 logprobs: int | None) -> None:
        self.model, self.tokenizer, self.prompt_tokens = model, tokenizer, prompt_tokens
        self.return_token_ids, self.logprobs = return_token_ids, logprobs
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _head(self, chunk: bool) -> dict[str, Any]:
        obj = f"{self.object_name}.chunk" if chunk and self.object_name == "chat.completion" else self.object_name
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _choice(self, steps: list[Step], finish_reason: str | None, **fields: Any) -> dict[str, Any]:
        choice = {"index": 0, **fields, "logprobs": self._logprobs(steps), "finish_reason": finish_reason}
        if self.return_token_ids:
            choice["token_ids"] = [s.token for s in steps]
        return choice

    def _with_prompt_ids(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.return_token_ids:
            body["prompt_token_ids"] = self.prompt_tokens
        return body

    def _token(self, token: int) -> tuple[str, bytes]:
        raw = self.tokenizer.token_bytes(token)
        return raw.decode("utf-8", errors="replace"), raw

    def place(self, steps: list[Step], text: str) -> None:
        """Note that `steps` released `text` (called for each group, in order, before it is rendered)."""

    def _logprobs(self, steps: list[Step]) -> Any:
        raise NotImplementedError

    def usage_chunk(self, gen: Generation) -> dict[str, Any]:
        return {**self._head(chunk=True), "choices": [], "usage": usage(gen)}

    def first_chunk(self) -> dict[str, Any] | None:
        return None

    def first_chunks(self) -> list[dict[str, Any]]:
        """What a stream opens with, before the first token."""
        first = self.first_chunk()
        return [] if first is None else [first]

    # SSE framing: OpenAI's chat and completions send bare data lines and end with [DONE]; the
    # Anthropic and Responses formats name each event and end with their own last event.
    def sse(self, body: dict[str, Any]) -> bytes:
        return b"data: " + dump_json(body) + b"\n\n"

    def sse_error(self, error: APIError) -> bytes:
        """An error after the stream began: the status is sent, so it goes in-band."""
        return self.sse(error.body())

    def sse_end(self) -> bytes:
        return b"data: [DONE]\n\n"


class ChatFormat(Format):
    """`reply` says how to read the reply: its thinking and its tool calls (default: all content)."""

    prefix, object_name = "chatcmpl", "chat.completion"

    def __init__(self, *args: Any, reply: ReplySyntax | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reply = reply or ReplySyntax()
        self._parser = self.reply.parser()
        self._n_calls = 0

    def _entry(self, token: int, logprob: float | None) -> dict[str, Any]:
        text, raw = self._token(token)
        return {"token": text, "logprob": logprob, "bytes": list(raw)}

    def _logprobs(self, steps: list[Step]) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        return {"content": [{**self._entry(s.token, s.logprob),
                             "top_logprobs": [self._entry(t, lp) for t, lp in s.top_logprobs]} for s in steps]}

    def first_chunk(self) -> dict[str, Any]:
        choice = self._choice([], None, delta={"role": "assistant", "content": ""})
        return self._with_prompt_ids({**self._head(chunk=True), "choices": [choice]})

    def _delta(self, kind: str, value: Any) -> dict[str, Any]:
        if kind != "tool_call":
            return {kind: value}
        self._n_calls += 1  # a whole call in one delta: clients that accumulate argument fragments take it too
        return {"tool_calls": [{"index": self._n_calls - 1, **value.to_dict()}]}

    def _delta_chunks(self, parts: list[Part], steps: list[Step]) -> list[dict[str, Any]]:
        # The steps travel with the first chunk, so each token is reported once.
        chunks = []
        for kind, value in parts:
            choice = self._choice(steps if not chunks else [], None, delta=self._delta(kind, value))
            chunks.append({**self._head(chunk=True), "choices": [choice]})
        return chunks

    def chunks(self, text: str, steps: list[Step]) -> list[dict[str, Any]]:
        """The chunks `text` completes; none while it may be part of a tag or call (keep the steps)."""
        return self._delta_chunks(self._parser.push(text), steps)

    def final_chunks(self, steps: list[Step], gen: Generation, queued_s: float) -> list[dict[str, Any]]:
        held = self._delta_chunks(self._parser.flush(), steps)
        finish = _finish_reason(gen, bool(self._parser.calls))
        choice = self._choice([] if held else steps, finish, delta={})
        return [*held, {**self._head(chunk=True), "choices": [choice], "timings": timings(gen, queued_s)}]

    def response(self, steps: list[Step], gen: Generation, queued_s: float) -> dict[str, Any]:
        message = whole_reply(self.reply, gen.text)
        choice = self._choice(steps, _finish_reason(gen, "tool_calls" in message), message=message)
        return self._with_prompt_ids({**self._head(chunk=False), "choices": [choice], "usage": usage(gen),
                                      "timings": timings(gen, queued_s)})


def _finish_reason(gen: Generation, called: bool) -> str | None:
    # As OpenAI: a reply that ends by calling tools finishes with "tool_calls".
    return "tool_calls" if called and gen.finish_reason == "stop" else gen.finish_reason


class CompletionFormat(Format):
    """Legacy completions: `logprobs: N` gives tokens, token_logprobs, top_logprobs and text_offset."""

    prefix, object_name = "cmpl", "text_completion"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._offset = 0  # characters of completion text already emitted
        self._offsets: dict[int, int] = {}  # id(step) -> where its text starts

    def place(self, steps: list[Step], text: str) -> None:
        # A token whose text was held back starts where the text finally released starts.
        for s in steps:
            self._offsets.setdefault(id(s), self._offset)
        self._offset += len(text)

    def _logprobs(self, steps: list[Step]) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        return {"tokens": [self._token(s.token)[0] for s in steps],
                "token_logprobs": [s.logprob for s in steps],
                "top_logprobs": [{self._token(t)[0]: lp for t, lp in s.top_logprobs} for s in steps],
                "text_offset": [self._offsets.get(id(s), self._offset) for s in steps]}

    def first_chunk(self) -> dict[str, Any] | None:
        return self._with_prompt_ids({**self._head(chunk=True), "choices": []}) if self.return_token_ids else None

    def chunks(self, text: str, steps: list[Step]) -> list[dict[str, Any]]:
        return [{**self._head(chunk=True), "choices": [self._choice(steps, None, text=text)]}]

    def final_chunks(self, steps: list[Step], gen: Generation, queued_s: float) -> list[dict[str, Any]]:
        choice = self._choice(steps, gen.finish_reason, text="")
        return [{**self._head(chunk=True), "choices": [choice], "timings": timings(gen, queued_s)}]

    def response(self, steps: list[Step], gen: Generation, queued_s: float) -> dict[str, Any]:
        choice = self._choice(steps, gen.finish_reason, text=gen.text)
        return self._with_prompt_ids({**self._head(chunk=False), "choices": [choice], "usage": usage(gen),
                                      "timings": timings(gen, queued_s)})


def named_event(body: dict[str, Any]) -> bytes:
    """An SSE event named by its body's type, as Anthropic's and OpenAI's Responses streams send them."""
    return b"event: " + str(body["type"]).encode() + b"\ndata: " + dump_json(body) + b"\n\n"
