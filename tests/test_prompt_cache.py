"""The host-RAM prompt cache (issue 24 item 4) on the numpy backend: switching conversations A, B, A
restores A and prefills only what is new, with the bits of an engine that never left A; the budget
evicts the least recently used; hybrid models restore their recurrent state; MTP restores its drafter;
expert offload restores too."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.offload.offload import OffloadConfig
from runner.spec.config import DraftConfig

GREEDY = SamplingParams(temperature=0.0)
GIB = 1 << 30
A = [7, 93, 411, 250, 18, 333, 64, 120, 5, 499, 77, 201, 14, 9, 300, 41, 2, 88, 150, 61, 19, 240, 31, 402]
B = [500, 12, 260, 33, 471, 90, 145, 208, 66, 380, 11, 95, 222, 47, 310, 170, 58, 402, 29, 133]
C = [101, 303, 44, 287, 350, 16, 199, 73, 460, 82, 231, 6, 149, 377, 52, 268, 25, 412, 190, 3]
MORE = [44, 45, 46, 47]


class Recorder:
    """Wraps an engine: the positions each trunk forward computed (any path: resident, streamed, layer-major)
    and the logits prefill, decode and verify returned."""

    def __init__(self, engine: Engine) -> None:
        self.rows: list[int] = []
        self.logits: list[np.ndarray] = []
        advance, prefill, decode, verify = engine.kv.advance, engine.prefill, engine.decode, engine.verify

        def counting(n_new: int) -> None:
            self.rows.append(n_new)
            advance(n_new)

        def keep(fn: Any) -> Any:
            def kept(*args: Any, **kwargs: Any) -> Any:
                out = fn(*args, **kwargs)
                self.logits.append(np.array(out[0] if isinstance(out, tuple) else out))
                return out
            return kept

        engine.kv.advance = counting
        engine.prefill, engine.decode, engine.verify = keep(prefill), keep(decode), keep(verify)


def _load(path: Any, cache_bytes: int = GIB, **config: Any) -> Engine:
    return Engine.load(path, EngineConfig(**{"n_ctx": 128, "ubatch": 8, "prompt_cache_bytes": cache_bytes, **config}))


def _ask(engine: Engine, prompt: list[int], draft: DraftConfig | None = None, n: int = 6) -> Any:
    return engine.generate(prompt, n, GREEDY, ignore_eos=True, draft=draft).run()


def _switch_back(path: Any, engine: Engine, draft: DraftConfig | None = None) -> None:
    """A, B, then A continued: the third request restores A's whole sequence and prefills only the new
    tokens, and its logits equal, bit for bit, those of an engine that ran A and its continuation alone."""
    first = _ask(engine, A, draft)
    _ask(engine, B, draft)
    follow_up = A + first.tokens[:-1] + MORE  # the last token was sampled, never fed
    recorder = Recorder(engine)
    third = _ask(engine, follow_up, draft)
    assert third.cached_tokens == third.restored_tokens == len(A) + len(first.tokens) - 1
    assert recorder.rows[0] == len(MORE)  # the prompt's one forward: the new suffix only

    alone = _load(path, 0, **_config(engine))
    _ask(alone, A, draft)
    fresh = Recorder(alone)
    again = _ask(alone, follow_up, draft)
    assert again.tokens == third.tokens
    assert len(fresh.logits) == len(recorder.logits)
    for got, want in zip(recorder.logits, fresh.logits):
        assert np.array_equal(got, want)


def _config(engine: Engine) -> dict[str, Any]:
    return {"n_ctx": engine.config.n_ctx, "ubatch": engine.config.ubatch, "offload": engine.config.offload}


@pytest.mark.parametrize("arch", ["glm4moe", "qwen3moe"])
def test_switching_back_restores_a_and_prefills_only_the_new_suffix_bit_for_bit(synth_model, arch: str) -> None:
    path = synth_model(arch)
    _switch_back(path, _load(path))


def test_without_a_prompt_cache_the_third_request_re_prefills_a(synth_model) -> None:
    engine = _load(synth_model("glm4moe"), 0)
    first = _ask(engine, A)
    _ask(engine, B)
    third = _ask(engine, A + first.tokens[:-1] + MORE)
    assert third.cached_tokens == third.restored_tokens == 0
    assert engine.prompt_cache is None


def test_continuing_a_conversation_saves_nothing_and_a_newer_turn_replaces_the_older_entry(synth_model) -> None:
    engine = _load(synth_model("glm4moe"))
    first = _ask(engine, A)
    second = _ask(engine, A + first.tokens[:-1] + MORE)  # the same conversation: no copy to host RAM
    assert len(engine.prompt_cache) == 0 and second.restored_tokens == 0
    _ask(engine, B)  # leaves A: A's whole sequence is saved
    assert len(engine.prompt_cache) == 1
    third = _ask(engine, A + first.tokens[:-1] + MORE + second.tokens[:-1] + [9])  # back to A, further on
    assert third.restored_tokens == len(A) + len(first.tokens) - 1 + len(MORE) + len(second.tokens) - 1
    _ask(engine, C)  # leaves A again: the longer A replaces the entry it extends
    saved = sorted(len(e.tokens) for e in engine.prompt_cache.entries.values())
    assert saved == [len(B) + 5, third.prompt_tokens + 5]


def test_the_budget_evicts_the_least_recently_used_entry(synth_model) -> None:
    path = synth_model("glm4moe")
    probe = _load(path)
    _ask(probe, A[:20])
    _ask(probe, B)
    entry_bytes = next(iter(probe.prompt_cache.entries.values())).nbytes  # 20 prompt + 5 decoded positions
    engine = _load(path, int(2.5 * entry_bytes))
    a_first = _ask(engine, A[:20])
    b_first = _ask(engine, B)
    _ask(engine, C)  # saves B; A and B now fill the budget
    assert len(engine.prompt_cache) == 2
    back_to_a = _ask(engine, A[:20] + a_first.tokens[:-1] + MORE)  # A becomes the most recently used; saving C evicts B
    assert back_to_a.restored_tokens == 25
    assert engine.prompt_cache.stats.evicted == 1
    back_to_b = _ask(engine, B + b_first.tokens[:-1] + MORE)
    assert back_to_b.restored_tokens == back_to_b.cached_tokens == 0  # B was evicted
    assert engine.prompt_cache.nbytes <= engine.prompt_cache.budget_bytes


def test_a_sequence_larger_than_the_whole_budget_is_not_copied(synth_model) -> None:
    engine = _load(synth_model("glm4moe"), 1024)
    _ask(engine, A)
    _ask(engine, B)
    assert len(engine.prompt_cache) == 0 and engine.prompt_cache.stats.too_large == 1


def test_cache_prompt_false_reuses_nothing_and_keeps_the_dropped_sequence(synth_model) -> None:
    engine = _load(synth_model("glm4moe"))
    first = _ask(engine, A)
    follow_up = A + first.tokens[:-1] + MORE
    uncached = engine.generate(follow_up, 2, GREEDY, ignore_eos=True, cache_prompt=False).run()
    assert uncached.cached_tokens == 0
    assert len(engine.prompt_cache) == 1  # A's sequence was saved before it was dropped
    _ask(engine, B)
    assert _ask(engine, follow_up + uncached.tokens[:-1] + [9]).restored_tokens == len(follow_up) + 1


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen3next"])
def test_a_hybrid_model_restores_its_recurrent_state(synth_model, arch: str) -> None:
    path = synth_model(arch)
    _switch_back(path, _load(path))


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen3next"])
def test_a_hybrid_model_restores_the_prompt_end_checkpoint_when_the_reply_is_not_kept(synth_model, arch: str) -> None:
    """The recurrent state exists only where it was saved: the prompt's end (a checkpoint) and the sequence's
    end. A follow-up that drops the reply restores the former, as the live cache would have."""
    path = synth_model(arch)
    engine = _load(path)
    first = _ask(engine, A)
    _ask(engine, B)
    edited = A + [first.tokens[0] + 1] + MORE
    recorder = Recorder(engine)
    third = _ask(engine, edited)
    assert third.restored_tokens == third.cached_tokens == len(A)
    assert recorder.rows[0] == len(edited) - len(A)
    alone = _load(path, 0)
    _ask(alone, A)
    fresh = Recorder(alone)
    assert _ask(alone, edited).tokens == third.tokens
    assert all(np.array_equal(a, b) for a, b in zip(recorder.logits, fresh.logits, strict=True))


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35moe"])
def test_mtp_drafting_restores_the_drafter_with_the_sequence(synth_model, arch: str) -> None:
    path = synth_model(arch)
    _switch_back(path, _load(path), DraftConfig("mtp", 2, adaptive=False))


@pytest.mark.parametrize(("arch", "draft"), [("glm4moe", None), ("qwen35moe", DraftConfig("mtp", 2, adaptive=False))])
def test_expert_offload_restores_a_sequence_and_streams_only_the_new_suffix(synth_model, arch: str,
                                                                           draft: DraftConfig | None) -> None:
    path = synth_model(arch, "Q8_0")
    offload = OffloadConfig(cache_slots=6, prefill_ubatch=8, transaction="always", decode_batch=3)
    engine = _load(path, offload=offload)
    _switch_back(path, engine, draft)
    assert engine.prompt_cache.stats.restored == 1
