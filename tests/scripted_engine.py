"""A real engine whose replies are scripted (no tests here): random weights never write a <think> block or
a tool call, so the server's parsing is tested on the tokens a real model of the family would emit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from runner.engine.engine import Engine
from runner.engine.generation import Generation, GenerationRequest, fit_to_context, generation_loop
from runner.engine.sampling import Sampler


class ScriptedEngine:
    """The real engine (tokenizer, context, counters), except that generate() replays the next scripted
    reply token by token through the real generation loop (stop strings, max_tokens, UTF-8 holding),
    then the end-of-generation token. Records each prompt it was given."""

    def __init__(self, engine: Engine, replies: list[str] | None = None) -> None:
        self._engine = engine
        self.replies = list(replies or [])
        self.prompts: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def script(self, *replies: str) -> None:
        self.replies = list(replies)

    def generate(self, prompt_tokens: list[int], max_tokens: int, sampling: Any, stop: list[str] | None = None,
                 ignore_eos: bool = False, logprobs: int | None = None, **_: Any) -> Generation:
        self.prompts.append(list(prompt_tokens))
        tokenizer = self._engine.tokenizer
        reply = tokenizer.encode(self.replies.pop(0), add_special=False, parse_special=True)
        logits = np.zeros(self._engine.model_config.n_vocab, dtype=np.float32)
        max_tokens = fit_to_context(len(prompt_tokens), max_tokens, self._engine.n_ctx)

        def source(_: np.ndarray, __: Sampler, ___: dict[int, int], ____: Any) -> Iterator[tuple[int, np.ndarray]]:
            for token in [*reply, tokenizer.eos_id]:
                yield token, logits

        gen = Generation(prompt_tokens=len(prompt_tokens), cached_tokens=0)
        req = GenerationRequest(max_tokens, sampling, tuple(stop or ()), ignore_eos, logprobs)
        gen._steps = generation_loop(gen, req, lambda: logits, source, tokenizer)
        return gen
