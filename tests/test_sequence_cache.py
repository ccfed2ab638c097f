"""The rollback contract (runner/engine/sequence_cache.py): a cache that cannot truncate plugs into the
engine unchanged. CheckpointOnlyKV is attention K/V made to behave like recurrent state: it can return
only to positions saved at a checkpoint (and to the rows of the one forward after it), so every path
that moves a sequence back (prefix reuse, rejected drafts, reset) must go through checkpoint,
reachable and rollback, and the output must not change."""

from __future__ import annotations

import numpy as np
import pytest

from runner.engine.engine import Engine, EngineConfig
from runner.engine.kv_cache import KVCache
from runner.engine.sampling import SamplingParams
from runner.models.transformer import MoETransformer
from runner.spec.config import DraftConfig

PROMPT = [7, 93, 411, 250, 18, 333, 64, 120, 5, 499, 77, 201, 14, 9, 300, 41, 2, 88, 150, 61]


class CheckpointOnlyKV(KVCache):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.saved = {0}
        self.open_at: int | None = None
        self.rollbacks: list[int] = []

    def checkpoint(self) -> None:
        self.saved.add(self.n_tokens)
        self.open_at = self.n_tokens

    def advance(self, n_new: int) -> None:
        if self.open_at is not None:  # the forward after a checkpoint keeps each of its rows reachable
            self.saved.update(range(self.open_at, self.n_tokens + n_new + 1))
            self.open_at = None
        super().advance(n_new)

    def reachable(self, n_tokens: int) -> int:
        return max(p for p in self.saved if p <= min(n_tokens, self.n_tokens))

    def rollback(self, n_tokens: int) -> None:
        assert n_tokens in self.saved, f"rollback to {n_tokens}, which no checkpoint saved ({sorted(self.saved)})"
        super().rollback(n_tokens)
        self.saved = {p for p in self.saved if p <= n_tokens}
        self.open_at = None
        self.rollbacks.append(n_tokens)


@pytest.fixture
def checkpoint_only(monkeypatch):
    def new_kv_cache(self, n_ctx):
        return CheckpointOnlyKV(self.ops, self.cfg.n_layer, n_ctx, self.cfg.n_head_kv, self.cfg.head_dim)

    monkeypatch.setattr(MoETransformer, "new_kv_cache", new_kv_cache)


def test_prefix_reuse_goes_back_only_to_a_reachable_position_and_the_logits_do_not_change(synth_model,
                                                                                           checkpoint_only):
    path = synth_model("qwen3moe")
    engine = Engine.load(path, EngineConfig(n_ctx=128, ubatch=8))
    engine.prefill(PROMPT)
    branch = PROMPT[:12] + [3, 4, 5]  # shares 12 positions, but only 0 and the prompt's end were saved
    got = engine.prefill(branch)
    assert engine.kv.rollbacks[-1] == 0
    extended = PROMPT + [6, 7]  # extends the prompt before: reuses all 20 positions
    engine.prefill(PROMPT)
    got_extended = engine.prefill(extended)
    assert engine.kv.rollbacks[-1] == len(PROMPT)
    fresh = Engine.load(path, EngineConfig(n_ctx=128, ubatch=8))
    np.testing.assert_array_equal(got, fresh.prefill(branch))
    fresh.reset()
    np.testing.assert_array_equal(got_extended, fresh.prefill(extended))


def test_greedy_mtp_with_a_checkpoint_only_cache_equals_plain_decoding(synth_model, checkpoint_only) -> None:
    path = synth_model("glm4moe", seed=41)
    greedy = SamplingParams(temperature=0.0)
    plain = Engine.load(path, EngineConfig(n_ctx=256, ubatch=16)).generate(PROMPT, 48, greedy, ignore_eos=True).run()
    engine = Engine.load(path, EngineConfig(n_ctx=256, ubatch=16))
    drafted = engine.generate(PROMPT, 48, greedy, ignore_eos=True, draft=DraftConfig("mtp", 3, adaptive=False)).run()
    assert drafted.tokens == plain.tokens
    assert len(set(plain.tokens)) > 10  # a diverse continuation, not one repeated token
    # every verify step rolled the trunk back into its own batch, and some drafts were rejected there
    assert len(engine.kv.rollbacks) >= drafted.draft.verify_steps > 0
    assert drafted.draft.accepted_n < drafted.draft.drafted_n
