"""Greedy output with MTP drafting is token-identical to plain decoding, over long generations.

Models of their own (seeds 41 and 42, F32 and a Q4_K_M mix) so no other test's file is reused. On
random weights the real NextN block's drafts are almost never accepted, so the TEST-ONLY oracle
drafter (drafts forced to the main model's own greedy tokens) covers the accept path at rate 1.0,
and the TEST-ONLY adversarial drafter (always wrong) the reject path at rate 0.0.
"""

from __future__ import annotations

import numpy as np
import pytest

from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.errors import GenerationError
from runner.spec.config import DraftConfig
from runner.spec.drafter import MTPDrafter
from runner.spec.verify import one_hot

N_NEW = 240
GREEDY = SamplingParams(temperature=0.0)
PROMPT = [7, 93, 411, 250, 18, 333, 64, 120, 5, 499, 77, 201]


class ScriptedDrafter(MTPDrafter):
    """TEST-ONLY: runs the real NextN block (its cache stays exercised), then replaces its drafts with
    `script(i)` for generated position i: the oracle's greedy reference, or a token that is never it."""

    def __init__(self, engine: Engine, script):
        super().__init__(engine.nextn[0], engine.n_ctx, engine.config.ubatch)
        self.script = script
        self.prompt_len = len(PROMPT)

    def draft(self, token, depth, pick):
        real, _, caught_up = super().draft(token, depth, pick)
        first = len(self.tokens) + 1 - self.prompt_len  # generated index of the first draft
        drafts = [self.script(first + i) for i in range(len(real))]
        return drafts, [one_hot(self.block.cfg.n_vocab, d) for d in drafts], caught_up


@pytest.fixture(scope="module", params=["F32", "Q4_K_M"])
def model(request, synth_model):
    path = synth_model("glm4moe", request.param, seed=41 if request.param == "F32" else 42)
    engine = Engine.load(path, EngineConfig(n_ctx=512, ubatch=64))
    reference = engine.generate(PROMPT, N_NEW, GREEDY, ignore_eos=True).run().tokens
    return path, reference


def _engine(path) -> Engine:
    return Engine.load(path, EngineConfig(n_ctx=512, ubatch=64))


def _assert_nextn_cache_is_the_blocks(path, drafter: MTPDrafter, tokens: list[int]) -> None:
    """The drafter's NextN entries equal the block run afresh over the trunk states of `tokens`."""
    fresh = _engine(path)
    _, hidden = fresh.model.forward(np.asarray(tokens), fresh.kv)  # trunk states of every position
    block = fresh.nextn[0]
    kv = block.new_kv_cache(fresh.n_ctx)
    n = drafter.kv.n_tokens
    block.forward(hidden[:n], np.asarray(tokens[1 : n + 1]), kv)
    # f16 entries: a last-bit float32 difference may round to the neighbouring f16 value (2^-10 relative at most)
    np.testing.assert_allclose(drafter.kv.k[0][:n], kv.k[0][:n], rtol=2**-10, atol=1e-4)
    np.testing.assert_allclose(drafter.kv.v[0][:n], kv.v[0][:n], rtol=2**-10, atol=1e-4)


def test_the_reference_is_a_diverse_continuation(model) -> None:
    _, reference = model
    assert len(reference) == N_NEW
    assert len(set(reference)) > 60  # no fixed point: identity over a repeated token would prove nothing


@pytest.mark.parametrize("depth,adaptive", [(1, False), (2, False), (3, False), (3, True)],
                         ids=["depth1", "depth2", "depth3", "adaptive"])
def test_greedy_with_mtp_drafts_equals_plain_decoding(model, depth: int, adaptive: bool) -> None:
    path, reference = model
    engine = _engine(path)
    gen = engine.generate(PROMPT, N_NEW, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", depth, adaptive)).run()
    assert gen.tokens == reference
    assert gen.draft is not None and gen.draft.verify_steps > 0
    if not adaptive:
        assert gen.draft.drafted[0] == gen.draft.verify_steps - 1  # every step drafted but the last (max_tokens)


def test_oracle_drafts_are_all_accepted_and_the_output_is_unchanged(model) -> None:
    path, reference = model
    engine = _engine(path)
    engine.drafter = ScriptedDrafter(engine, lambda i: reference[i])
    gen = engine.generate(PROMPT, N_NEW, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 3, adaptive=False)).run()
    assert gen.tokens == reference
    t = gen.timings()
    assert t["draft_acceptance"] == 1.0 and t["draft_acceptance_by_depth"] == [1.0, 1.0, 1.0]
    assert t["tokens_per_verify"] > 3.9  # 4 tokens per verify step, the last step shortened by max_tokens


def test_adversarial_drafts_are_all_rejected_and_the_output_is_unchanged(model) -> None:
    path, reference = model
    engine = _engine(path)
    n_vocab = engine.model_config.n_vocab
    engine.drafter = ScriptedDrafter(engine, lambda i: (reference[i] + 1) % n_vocab)
    gen = engine.generate(PROMPT, N_NEW, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 3, adaptive=False)).run()
    assert gen.tokens == reference
    assert gen.draft.accepted_n == 0 and gen.draft.tokens_per_verify == 1.0


@pytest.mark.parametrize("drafts", ["real", "oracle", "wrong"])
def test_choices_on_the_backend_keep_the_tokens_the_drafts_and_the_acceptance(model, monkeypatch, drafts: str) -> None:
    """Engine.MTP_GREEDY_ON_DEVICE: each draft and each verify row's token come from the backend's argmax
    (Ops.greedy_token, greedy_rows); no logits row comes to the host after the prompt's, and the tokens, the drafts
    and what was accepted are the host's picks'."""
    path, reference = model
    scripts = {"oracle": lambda i: reference[i], "wrong": lambda i: (reference[i] + 1) % 50}

    def run(on_device: bool):
        monkeypatch.setattr(Engine, "MTP_GREEDY_ON_DEVICE", on_device)
        engine = _engine(path)
        if drafts in scripts:
            engine.drafter = ScriptedDrafter(engine, scripts[drafts])
        downloads = []
        to_host = engine.ops.to_host
        monkeypatch.setattr(engine.ops, "to_host", lambda x: downloads.append(np.shape(x)) or to_host(x))
        gen = engine.generate(PROMPT, N_NEW, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 3, adaptive=False))
        gen.run()
        n_vocab = engine.model_config.n_vocab
        counts = {k: v for k, v in gen.draft.to_dict().items() if not k.endswith("_s")}  # not the timings
        return gen.tokens, counts, sum(1 for shape in downloads if shape[-1] == n_vocab)

    host, on_device = run(False), run(True)
    assert host[0] == on_device[0] == reference
    assert on_device[1] == host[1]  # drafted and accepted by depth, verify steps
    assert host[2] >= host[1]["verify_steps"] and on_device[2] == 1  # rows a step on the host; the prompt's only
    if drafts == "oracle":
        assert on_device[1]["draft_acceptance"] == 1.0


@pytest.mark.parametrize("offload", [False, True])
def test_depth_zero_verifies_through_the_decode_path_and_keeps_the_nextn_cache_whole(synth_model, monkeypatch,
                                                                                     offload: bool) -> None:
    """Always-wrong drafts drive adaptive depth to 0; those steps decode one token through
    ops.decode_forward (the decode graph on CUDA), the output stays plain decoding's and the
    NextN block still sees every position's trunk state."""
    from types import SimpleNamespace

    from runner.offload.offload import OffloadConfig
    from runner.spec import verify as speculative

    # Every timed interval is one tick, so the depth policy sees a draft step and a verify batch of any
    # size cost the same: its choice follows acceptance alone, not this machine's load.
    ticks = iter(range(1_000_000))
    monkeypatch.setattr(speculative, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))

    path = synth_model("glm4moe", "F32", seed=41)
    want = _engine(path).generate(PROMPT, 60, GREEDY, ignore_eos=True).run().tokens
    slots = OffloadConfig(cache_slots=8, decode_batch=4, transaction="always") if offload else None
    engine = Engine.load(path, EngineConfig(n_ctx=512, ubatch=64, offload=slots))
    n_vocab = engine.model_config.n_vocab
    engine.drafter = ScriptedDrafter(engine, lambda i: (want[min(i, len(want) - 1)] + 1) % n_vocab)
    calls = []
    real = engine.ops.decode_forward
    engine.ops.decode_forward = lambda *a: calls.append(a[1]) or real(*a)
    gen = engine.generate(PROMPT, 60, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 3)).run()
    assert gen.tokens == want
    assert engine.draft_stats()["draft_depth"] == 0 and len(calls) > 20  # most steps ran at depth 0
    tokens, drafter = engine.kv_tokens, engine.drafter
    _assert_nextn_cache_is_the_blocks(path, drafter, tokens)
    assert drafter.next_position == len(tokens)  # the rest waits as pending trunk rows


def test_oracle_with_adaptive_depth_stays_deep_and_lossless(model) -> None:
    path, reference = model
    engine = _engine(path)
    engine.drafter = ScriptedDrafter(engine, lambda i: reference[i])
    gen = engine.generate(PROMPT, N_NEW, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 3)).run()
    assert gen.tokens == reference and gen.draft.acceptance == 1.0


def test_penalties_see_the_accepted_drafts_before_them(synth_model) -> None:
    path = synth_model("glm4moe", "F32", seed=41)
    params = SamplingParams(temperature=0.0, presence_penalty=0.7, frequency_penalty=0.4)
    want = _engine(path).generate(PROMPT, 120, params, ignore_eos=True).run().tokens
    engine = _engine(path)
    engine.drafter = ScriptedDrafter(engine, lambda i: want[i])
    gen = engine.generate(PROMPT, 120, params, ignore_eos=True, draft=DraftConfig("mtp", 3, adaptive=False)).run()
    assert gen.tokens == want and gen.draft.acceptance == 1.0


def test_logit_bias_is_lossless_with_drafts(synth_model) -> None:
    """Verify rows are biased as plain decoding's: drafts the bias forbids are rejected."""
    path = synth_model("glm4moe", "F32", seed=41)
    free = _engine(path).generate(PROMPT, 60, GREEDY, ignore_eos=True).run().tokens
    params = SamplingParams(temperature=0.0, logit_bias=((free[0], -100.0), (free[5], 4.0)))
    want = _engine(path).generate(PROMPT, 60, params, ignore_eos=True).run().tokens
    assert want != free
    engine = _engine(path)
    engine.drafter = ScriptedDrafter(engine, lambda i: free[i] if i < len(free) else 0)  # unbiased drafts
    gen = engine.generate(PROMPT, 60, params, ignore_eos=True, draft=DraftConfig("mtp", 3, adaptive=False)).run()
    assert gen.tokens == want and gen.draft.acceptance < 1.0


def test_second_turn_reuses_the_prefix_and_stays_identical(synth_model) -> None:
    path = synth_model("glm4moe", "F32", seed=41)
    plain, drafted = _engine(path), _engine(path)
    first = plain.generate(PROMPT, 60, GREEDY, ignore_eos=True).run().tokens
    assert drafted.generate(PROMPT, 60, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 2)).run().tokens == first
    turn2 = PROMPT + first + [3, 44, 150]
    want = plain.generate(turn2, 80, GREEDY, ignore_eos=True)
    got = drafted.generate(turn2, 80, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 2))
    assert got.cached_tokens == want.cached_tokens  # the drafter did not cost the prefix
    assert got.run().tokens == want.run().tokens


def test_nextn_cache_covers_the_whole_context(synth_model) -> None:
    """After a generation the NextN entries are those of the block run over the trunk states of every position."""
    path = synth_model("glm4moe", "F32", seed=41)
    engine = _engine(path)
    gen = engine.generate(PROMPT, 40, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 3, adaptive=False)).run()
    drafter = engine.drafter
    tokens = engine.kv_tokens
    assert drafter.tokens == tokens and drafter.next_position == len(tokens)
    _assert_nextn_cache_is_the_blocks(path, drafter, tokens)
    assert len(gen.tokens) == 40


def test_mtp_on_a_model_without_a_nextn_block_is_refused(synth_model) -> None:
    engine = Engine.load(synth_model("qwen3moe", "F32", seed=41), EngineConfig(n_ctx=64))
    with pytest.raises(GenerationError, match="needs a NextN"):
        engine.generate([1, 2, 3], 4, GREEDY, draft=DraftConfig("mtp"))
    assert engine.generate([1, 2, 3], 4, GREEDY, draft=DraftConfig("none")).run().draft is None


def test_drafting_through_the_expert_cache_and_a_streamed_prompt_stays_identical(synth_model) -> None:
    from runner.offload.offload import OffloadConfig

    path = synth_model("glm4moe", "F32", seed=41)
    want = _engine(path).generate(PROMPT, 100, GREEDY, ignore_eos=True).run().tokens
    # 6 of 8 slots: the prompt's states reach the NextN block in batches the slots can serve (3 rows at top-2).
    offload = OffloadConfig(cache_slots=6, decode_batch=3, transaction="always")
    engine = Engine.load(path, EngineConfig(n_ctx=512, ubatch=64, offload=offload))
    gen = engine.generate(PROMPT, 100, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 2, adaptive=False)).run()
    assert gen.tokens == want
    assert engine.stats()["phase"]["ends"] == 1  # the prompt was streamed inside the phase transaction
    with pytest.raises(GenerationError, match="expert cache is sized for 3"):
        engine.generate(PROMPT, 10, GREEDY, draft=DraftConfig("mtp", 3))


@pytest.mark.parametrize("order", ["layer_major", "per_microbatch"])
def test_a_streamed_prompt_catches_the_nextn_block_up_inside_the_phase(synth_model, order: str) -> None:
    """The NextN block's experts stream after the prompt's (one more visit, its layer), it takes every
    prompt state but the last there, and its cache equals the block run over the trunk states."""
    from runner.offload.offload import OffloadConfig

    path = synth_model("glm4moe", "F32", seed=41)
    prompt = PROMPT * 3
    offload = OffloadConfig(cache_slots=6, decode_batch=3, transaction="always", prefill_order=order,
                            prefill_ubatch=16)
    engine = Engine.load(path, EngineConfig(n_ctx=512, ubatch=64, offload=offload))
    caught: list[int] = []
    engine.drafter = drafter = MTPDrafter(engine.nextn[0], engine.n_ctx, engine._nextn_batch_rows())
    real_draft = drafter.draft

    def draft(token, depth, pick):
        out = real_draft(token, depth, pick)
        caught.append(out[2])
        return out

    drafter.draft = draft
    nextn_layer = engine.model_config.n_layer
    gen = engine.generate(prompt, 20, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 2, adaptive=False)).run()
    assert gen.tokens == _engine(path).generate(prompt, 20, GREEDY, ignore_eos=True).run().tokens
    streamed = engine.stats()["prefill"]["last_prompt"]["per_layer"]
    assert streamed[nextn_layer]["visits"] == 1 and streamed[nextn_layer]["experts"] > 0
    assert caught[0] == 1  # only the last prompt position waited for the first sampled token
    tokens = engine.kv_tokens
    _assert_nextn_cache_is_the_blocks(path, drafter, tokens)


def test_edits_resets_and_cancelled_prompts_leave_the_drafter_consistent(synth_model) -> None:
    """The drafter keeps only what a new prompt shares with what it saw; every reply still equals plain decoding."""
    path = synth_model("glm4moe", "F32", seed=41)
    plain, drafted = (Engine.load(path, EngineConfig(n_ctx=256, ubatch=4)) for _ in range(2))
    draft = DraftConfig("mtp", 3, adaptive=False)

    def after_one_micro_batch():  # a client that goes away during the prompt
        asked = iter([False])
        return lambda: next(asked, True)

    def run(prompt: list[int], n: int = 25, cancel: bool = False) -> None:
        want = plain.generate(prompt, n, GREEDY, ignore_eos=True,
                              cancelled=after_one_micro_batch() if cancel else None).run()
        got = drafted.generate(prompt, n, GREEDY, ignore_eos=True, draft=draft,
                               cancelled=after_one_micro_batch() if cancel else None).run()
        assert got.tokens == want.tokens and len(got.tokens) == (0 if cancel else n)
        # An edit can cost one prompt token: the trunk state before the edit is recomputed for the NextN block.
        assert want.cached_tokens - 1 <= got.cached_tokens <= want.cached_tokens

    run(PROMPT)
    run(PROMPT[:6] + [9, 10])  # an edit: shares less than the cache holds
    run(PROMPT + [1, 2, 3, 4, 5, 6, 7, 8, 9], cancel=True)  # stopped after the first micro-batch
    run(PROMPT + [1, 2, 3, 4, 5, 6, 7, 8, 9])
    plain.logits_all(PROMPT[:5])
    drafted.logits_all(PROMPT[:5])  # resets the main cache behind the drafter's back
    run(PROMPT + [44])


def test_logprobs_with_drafts_equal_plain_decoding(synth_model) -> None:
    path = synth_model("glm4moe", "F32", seed=41)
    want = list(_engine(path).generate(PROMPT, 30, GREEDY, ignore_eos=True, logprobs=3).steps())
    got = list(_engine(path).generate(PROMPT, 30, GREEDY, ignore_eos=True, logprobs=3,
                                      draft=DraftConfig("mtp", 3, adaptive=False)).steps())
    assert got == want
