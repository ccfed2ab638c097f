"""A hybrid model's sequence state (runner/engine/hybrid_cache.py) under the rollback contract: every way
the engine moves a sequence back (prefix reuse, rejected drafts, reset) lands on exactly the state a
fresh computation of the kept tokens gives, without recomputing what it kept."""

from __future__ import annotations

import numpy as np
import pytest

from runner.engine.engine import Engine, EngineConfig
from runner.engine.hybrid_cache import HybridCache
from runner.engine.sampling import SamplingParams
from runner.spec.config import DraftConfig
from test_hybrid_periodic_checkpoints import counting_forward_rows

PROMPT = [7, 93, 411, 250, 18, 333, 64, 120, 5, 499, 77, 201, 14, 9, 300, 41, 2, 88, 150, 61]
HYBRIDS = ["qwen35moe", "qwen3next"]


def _engine(path, ubatch: int = 8) -> Engine:
    return Engine.load(path, EngineConfig(n_ctx=128, ubatch=ubatch))


def _decoded(engine: Engine, tokens: list[int]) -> np.ndarray:
    """Logits after feeding `tokens` one decode step at a time."""
    logits = None
    for t in tokens:
        logits = engine.decode(t)
    return logits


@pytest.mark.parametrize("arch", HYBRIDS)
def test_prefix_reuse_returns_to_a_checkpoint_and_gives_a_fresh_prefill_s_logits(synth_model, arch: str) -> None:
    engine = _engine(synth_model(arch))
    assert isinstance(engine.kv, HybridCache)
    engine.prefill(PROMPT)
    branch = PROMPT[:12] + [3, 4, 5]  # shares 12 positions, but the state was saved only at 20 (and 0)
    assert engine.kv.reachable(12) == 0
    got_branch = engine.prefill(branch)
    engine.prefill(PROMPT)
    extended = PROMPT + [6, 7]  # extends the prompt before: keeps all 20 positions, computes 2
    assert engine.kv.reachable(20) == 20
    got_extended = engine.prefill(extended)
    fresh = _engine(synth_model(arch))
    np.testing.assert_array_equal(got_branch, fresh.prefill(branch))
    fresh.reset()
    np.testing.assert_array_equal(got_extended, fresh.prefill(extended))


@pytest.mark.parametrize("arch", HYBRIDS)
@pytest.mark.parametrize("kept", [0, 1, 3, 4])
def test_a_verify_batch_rolls_back_to_any_of_its_rows_without_recomputing(synth_model, arch: str,
                                                                         kept: int) -> None:
    path = synth_model(arch)
    engine = _engine(path)
    engine.prefill(PROMPT)
    batch = [400, 12, 250, 31]
    rows, _ = engine.verify(batch)  # the checkpoint at 20 keeps the state after each of its 4 rows
    assert [engine.kv.reachable(20 + i) for i in range(5)] == [20, 21, 22, 23, 24]
    engine.rollback(20 + kept)
    after = _decoded(engine, [77, 5])  # and the sequence goes on from there
    reference = _engine(path)
    reference.prefill(PROMPT)
    decoded = [_decoded(reference, batch[: i + 1][-1:]) for i in range(kept)]
    for i, row in enumerate(decoded):  # a verify row is the decode step's bits (batch invariance)
        np.testing.assert_array_equal(rows[i], row)
    np.testing.assert_array_equal(after, _decoded(reference, [77, 5]))


def test_row_states_last_until_the_next_checkpoint_and_position_0_is_always_reachable(synth_model) -> None:
    engine = _engine(synth_model("qwen35moe"))
    engine.prefill(PROMPT)
    engine.verify([1, 2, 3])
    engine.rollback(22)
    engine.verify([4, 5])  # a new checkpoint at 22: the first batch's rows are gone, 20 and 22 stay
    assert [engine.kv.reachable(n) for n in (19, 20, 21, 22, 23, 24)] == [0, 20, 20, 22, 23, 24]
    with pytest.raises(ValueError, match="not reachable"):
        engine.kv.rollback(21)
    engine.rollback(0)
    assert engine.kv.n_tokens == 0 and all(not s.ssm.any() for s in engine.kv.states)


@pytest.mark.parametrize("arch", HYBRIDS)
def test_greedy_mtp_drafting_equals_plain_decoding(synth_model, arch: str) -> None:
    path = synth_model(arch)
    greedy = SamplingParams(temperature=0.0)
    plain = _engine(path, 16).generate(PROMPT, 40, greedy, ignore_eos=True).run()
    engine = _engine(path, 16)
    drafted = engine.generate(PROMPT, 40, greedy, ignore_eos=True, draft=DraftConfig("mtp", 3, adaptive=False)).run()
    assert drafted.tokens == plain.tokens
    assert len(set(plain.tokens)) > 10  # a diverse continuation, not one repeated token
    assert drafted.draft.verify_steps > 0 and drafted.draft.accepted_n < drafted.draft.drafted_n  # rejections


@pytest.mark.parametrize(("answer_kept", "reused"), [(6, 25), (3, 21)])
def test_a_second_turn_keeps_the_first_turn_s_state(synth_model, monkeypatch, answer_kept: int, reused: int) -> None:
    """The next prompt extends the whole cached sequence (all 25 positions kept), or leaves the answer
    after 3 of its tokens (a template that re-renders it): back to the first decode step's saved row."""
    path = synth_model("qwen3next")
    engine = _engine(path)
    greedy = SamplingParams(temperature=0.0)
    first = engine.generate(PROMPT, 6, greedy, ignore_eos=True).run()  # caches 20 + 5 decoded positions
    second_turn = PROMPT + first.tokens[:answer_kept] + [44, 45, 46]
    computed = counting_forward_rows(engine, monkeypatch)
    second = engine.generate(second_turn, 6, greedy, ignore_eos=True)
    assert second.cached_tokens == reused
    second.run()
    assert computed[0] == len(second_turn) - reused  # the prompt's forward computed only the rest
    fresh = _engine(path).generate(second_turn, 6, greedy, ignore_eos=True).run()
    assert second.tokens == fresh.tokens
