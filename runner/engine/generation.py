"""One request's generation loop: sample, detokenize, stop; per-token steps with optional logprobs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from runner.engine.sampling import NON_FINITE, NonFiniteLogits, Sampler, SamplingParams, best_first, check_finite
from runner.engine.stopping import StopMatcher
from runner.errors import GenerationError
from runner.spec.stats import DraftStats

# A token source: (first logits, sampler, generated-token counts, room left) -> tokens, each with
# the logits it was chosen from (None: chosen where the logits are, already checked finite), committed to the
# sampler (`accept`) before it is yielded. Plain decoding and plain greedy decoding below; MTP drafting in
# spec/verify.py (speculative_tokens).
TokenSource = Callable[[np.ndarray, Sampler, dict[int, int], Callable[[], int]],
                       Iterator[tuple[int, np.ndarray | None]]]


@dataclass(frozen=True)
class Step:
    """One generated token (or, with token None, text released at the end) and what it emitted."""

    token: int | None
    text: str  # may be empty: an incomplete UTF-8 character or a possible stop string is held back
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass
class Generation:
    """A prepared request; iterate `steps()` or `pieces()` (or call `run()`), then read the fields."""

    prompt_tokens: int
    cached_tokens: int  # prompt tokens not prefilled: reused from the live cache or restored
    restored_tokens: int = 0  # of those, the ones restored from the host-RAM prompt cache
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop", "length", or None if the consumer stopped early
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft: DraftStats | None = None  # acceptance statistics when MTP drafting ran
    offload: dict[str, Any] | None = None  # expert offload figures of this request (runner/offload/figures.py)
    # Called once the prompt is prefilled, before any decode step is submitted: where a measurement splits the
    # prompt's work from the decode's (a greedy chain submits its first step before it yields the first token).
    on_prefilled: Callable[[], None] | None = None
    _steps: Iterator[Step] | None = None

    def steps(self) -> Iterator[Step]:
        assert self._steps is not None, "a Generation runs once"
        steps, self._steps = self._steps, None
        yield from steps

    def pieces(self) -> Iterator[str]:
        for step in self.steps():
            if step.text:
                yield step.text

    def run(self) -> "Generation":
        for _ in self.steps():
            pass
        return self

    def timings(self) -> dict[str, float | int]:
        new_prompt = self.prompt_tokens - self.cached_tokens
        n_decoded = max(len(self.tokens) - 1, 0)  # the first token comes from prefill (MEASURING.md)
        drafting = self.draft.to_dict() if self.draft is not None else {}
        offload = self.offload or {}
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "restored_tokens": self.restored_tokens,
            "prefill_s": self.prefill_s,
            "prefill_tok_s": new_prompt / self.prefill_s if self.prefill_s > 0 else 0.0,
            "completion_tokens": len(self.tokens),
            "decode_s": self.decode_s,
            "decode_tok_s": n_decoded / self.decode_s if self.decode_s > 0 else 0.0,
            **drafting,
            **offload,
        }


@dataclass(frozen=True)
class GenerationRequest:
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: no logprobs; N: the chosen token's and the N most likely


def fit_to_context(prompt_tokens: int, max_tokens: int | None, n_ctx: int) -> int:
    """The tokens a request may generate: `max_tokens` (None: no limit) capped at the room the context
    leaves, so a generation that reaches the context end stops with finish_reason "length", as
    llama-server's does. Only a prompt that leaves no room for a token is refused."""
    room = n_ctx - prompt_tokens
    if room < 1:
        raise GenerationError(f"prompt ({prompt_tokens} tokens) exceeds the context ({n_ctx}): at most "
                              f"{n_ctx - 1} prompt tokens leave room to generate")
    return room if max_tokens is None else min(max_tokens, room)


def plain_tokens(decode: Callable[[int], np.ndarray]) -> TokenSource:
    """One token per forward pass: sample, then decode it for the next logits (only when asked for)."""

    def tokens(logits: np.ndarray, sampler: Sampler, counts: dict[int, int],
               room: Callable[[], int]) -> Iterator[tuple[int, np.ndarray]]:
        while True:
            token = sampler(penalised(logits, counts, sampler.params))
            sampler.accept(token)
            yield token, logits
            logits = decode(token)

    return tokens


def backend_tokens(choose: Callable[[int, Sampler], int]) -> TokenSource:
    """Decoding whose choice is made from what the backend returns instead of the logits row: the first token from
    the prompt's logits as plain_tokens picks it, every later one `choose(token, sampler)` (decode `token`, then
    the next token)."""

    def tokens(logits: np.ndarray, sampler: Sampler, counts: dict[int, int],
               room: Callable[[], int]) -> Iterator[tuple[int, np.ndarray | None]]:
        token = sampler(logits)
        sampler.accept(token)
        yield token, logits
        while True:
            token = choose(token, sampler)
            sampler.accept(token)
            yield token, None

    return tokens


def greedy_tokens(decode_greedy: Callable[[int], int]) -> TokenSource:
    """Plain greedy decoding with the choice made on the backend (`decode_greedy(token)`: the next token, as
    argmax of its logits, without bringing them to the host). Only for requests whose choice is the raw
    logits' argmax (is_plain_greedy)."""
    return backend_tokens(lambda token, sampler: decode_greedy(token))


def chained_greedy_tokens(chain_of: Callable[[], Any], known: Callable[[int], None],
                          settle: Callable[[], None]) -> TokenSource:
    """Plain greedy decoding one step ahead (backends/greedy_chain.py): the step choosing token t + 1 is submitted
    before the host waits for token t, reading its input where step t chose it, so the host's work a token
    overlaps the device's. The same tokens as greedy_tokens. Only a step the request may still use is submitted
    (room() >= 2: token t + 2 within max_tokens); a step whose input is still on the device when the consumer
    stops is waited for. `known(token)` names each step's input once the host has it, in order (the engine's
    record of the cache); `settle()` runs last, every step waited for (a step after non-finite logits read a
    token nobody chose: the engine drops it)."""

    def tokens(logits: np.ndarray, sampler: Sampler, counts: dict[int, int],
               room: Callable[[], int]) -> Iterator[tuple[int, np.ndarray | None]]:
        token = sampler(logits)
        sampler.accept(token)
        chain, in_flight = chain_of(), 0
        try:
            if room() >= 2:
                chain.submit(token)
                known(token)
                in_flight = 1
            yield token, logits
            while in_flight:
                if room() >= 2:
                    chain.submit(None)  # its input: the choice of the step still in flight
                    in_flight += 1
                token = chain.take()
                in_flight -= 1
                if token is None:
                    raise NonFiniteLogits(NON_FINITE)
                if in_flight:
                    known(token)
                sampler.accept(token)
                yield token, None
        finally:
            for _ in range(in_flight):
                chain.take()
            settle()

    return tokens


def top_k_tokens(decode_top_k: Callable[[int], tuple[np.ndarray, np.ndarray]]) -> TokenSource:
    """Sampling whose chain starts with top-k, the k best chosen on the backend (`decode_top_k(token)`: the next
    step's k best ids and their logits, best_first's order, without bringing the row to the host) and the rest of
    the chain and the draw on the host (Sampler.from_top_k): the same tokens plain_tokens draws, seed for seed.
    Only for is_plain_top_k requests."""
    return backend_tokens(lambda token, sampler: sampler.from_top_k(*decode_top_k(token)))


def is_plain_top_k(req: GenerationRequest, n_vocab: int) -> bool:
    """The request samples through a chain that starts with top-k (0 < top_k < n_vocab) over the raw logits."""
    p = req.sampling
    return not p.greedy and 0 < p.top_k < n_vocab and _needs_no_row(req)


def is_plain_greedy(req: GenerationRequest) -> bool:
    """The request's next token is the argmax of the raw logits: greedy, and nothing (a grammar, a bias, a
    penalty, logprobs) that needs the logits on the host."""
    return req.sampling.greedy and _needs_no_row(req)


def _needs_no_row(req: GenerationRequest) -> bool:
    """Nothing of the request (a grammar, a bias, a penalty, logprobs) needs the whole logits row on the host."""
    p = req.sampling
    return (p.grammar is None and not p.logit_bias and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
            and p.repeat_penalty == 1.0 and req.logprobs is None)


def generation_loop(gen: Generation, req: GenerationRequest, prefill: Callable[[], np.ndarray | None],
                    source: TokenSource, tokenizer: Any) -> Iterator[Step]:
    """Take tokens from `source` until EOG, a stop string, a complete grammar or max_tokens; fills `gen` as
    it goes. A prefill that returns None was cancelled: nothing is generated and finish_reason stays None.
    Logits with a NaN or an infinity end the generation with NonFiniteLogits naming the position."""
    sampler, decoder, matcher = Sampler(req.sampling), tokenizer.decoder(), StopMatcher(list(req.stop))
    counts: dict[int, int] = {}
    if req.max_tokens == 0:
        gen.finish_reason = "length"
        return
    t0 = time.perf_counter()
    logits = prefill()
    gen.prefill_s = time.perf_counter() - t0
    if logits is None:
        return
    if gen.on_prefilled is not None:
        gen.on_prefilled()
    t_first = time.perf_counter()
    tokens = source(logits, sampler, counts, lambda: req.max_tokens - len(gen.tokens))
    try:
        for token, logits in tokens:
            if logits is not None:  # None: the backend chose the token and checked the logits
                check_finite(logits)  # MTP picks greedy drafts by argmax, outside the sampler
            if tokenizer.is_eog(token) and not req.ignore_eos:
                gen.finish_reason = "stop"
                break
            gen.tokens.append(token)
            counts[token] = counts.get(token, 0) + 1
            piece = matcher.push(decoder.push(token))
            gen.text += piece
            yield Step(token, piece, *_logprobs(logits, token, req.logprobs))
            if matcher.stopped or sampler.done:  # done: the grammar is complete, only an EOG could follow
                gen.finish_reason = "stop"
                break
            if len(gen.tokens) >= req.max_tokens:
                gen.finish_reason = "length"
                break
        if not matcher.stopped:
            tail = matcher.push(decoder.flush()) + matcher.flush()
            if tail:
                gen.text += tail
                yield Step(None, tail)
    except NonFiniteLogits:
        raise NonFiniteLogits(f"the model produced non-finite logits (NaN or infinity) at position "
                              f"{gen.prompt_tokens + len(gen.tokens)}: its weights or metadata are broken") from None
    finally:
        tokens.close()
        gen.decode_s = time.perf_counter() - t_first


def penalised(logits: np.ndarray, counts: dict[int, int], p: SamplingParams) -> np.ndarray:
    """The request's logit_bias, then llama.cpp's repeat penalty, then OpenAI presence/frequency penalties over
    the tokens generated so far (llama.cpp's sampler chain applies the bias first too)."""
    penalise = bool(counts) and not (p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
                                     and p.repeat_penalty == 1.0)
    if not penalise and not p.logit_bias:
        return logits
    out = np.array(logits, dtype=np.float32, copy=True)
    for token, bias in p.logit_bias:
        out[token] += bias
    if not penalise:
        return out
    ids = np.fromiter(counts, dtype=np.int64)
    n = np.fromiter(counts.values(), dtype=np.float32)
    if p.repeat_penalty != 1.0:  # as llama.cpp: toward zero from either side, so a seen token gets less likely
        seen = out[ids]
        out[ids] = np.where(seen > 0, seen / p.repeat_penalty, seen * p.repeat_penalty)
    out[ids] -= p.frequency_penalty * n + p.presence_penalty
    return out


def _logprobs(logits: np.ndarray, token: int, top_n: int | None) -> tuple[float | None, tuple[tuple[int, float], ...]]:
    if top_n is None:
        return None, ()
    x = np.asarray(logits, dtype=np.float64)
    logp = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
    top = best_first(logp, top_n)
    return float(logp[token]), tuple((int(t), float(logp[t])) for t in top)
