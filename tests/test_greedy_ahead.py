"""Engine.GREEDY_AHEAD: plain greedy decoding a step ahead of the host (generation.chained_greedy_tokens over the
backend's GreedyChain). The same tokens, text and finish reasons as one step at a time, resident and under expert
offload; at most one step more than those (only where the request ended before max_tokens); and a cache whose
record names exactly its positions, so the next request continues as it would have."""

from __future__ import annotations

import pytest

from runner.backends.greedy_chain import SyncGreedyChain
from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.offload.offload import OffloadConfig

PROMPT = [5, 6, 8, 13, 21]
GREEDY = SamplingParams(temperature=0.0)


class CountingOps(NumpyOps):
    """NumpyOps that counts decode steps, and the chain's steps submitted and taken (a device chain's steps run
    after their submit: every one must be waited for before the generation ends)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = self.submitted = self.taken = 0

    def decode_forward(self, *args, **kwargs):
        self.steps += 1
        return super().decode_forward(*args, **kwargs)

    def greedy_chain(self, model, kv, step):
        chain, ops = super().greedy_chain(model, kv, step), self

        class Counted:
            def submit(self, token):
                ops.submitted += 1
                chain.submit(token)

            def take(self):
                ops.taken += 1
                return chain.take()

        return Counted()


@pytest.fixture(scope="module", params=["resident", "offload"])
def engine(request, synth_model) -> Engine:
    offload = OffloadConfig(cache_slots=3, prefill_ubatch=8, transaction="always") if request.param == "offload" else None
    return Engine.load(synth_model("glm4moe"), EngineConfig(n_ctx=96, ubatch=8, offload=offload), ops=CountingOps())


def _generate(engine: Engine, ahead: bool, monkeypatch: pytest.MonkeyPatch, prompt: list[int], n: int,
              **kwargs) -> tuple[tuple, int]:
    monkeypatch.setattr(Engine, "GREEDY_AHEAD", ahead)
    before = engine.ops.steps
    gen = engine.generate(prompt, n, GREEDY, **kwargs).run()
    assert engine.ops.submitted == engine.ops.taken
    assert engine.kv.n_tokens == len(engine.kv_tokens)
    assert engine.kv_tokens[: len(prompt) + len(gen.tokens) - 1] == [*prompt, *gen.tokens[:-1]]
    return (gen.tokens, gen.text, gen.finish_reason), engine.ops.steps - before


@pytest.mark.parametrize("n,kwargs", [(12, {"ignore_eos": True}), (12, {}), (12, {"stop": (" ",)}), (1, {}), (2, {}),
                                      (30, {"ignore_eos": True})])
def test_a_step_ahead_gives_the_same_generation_and_the_same_next_one(engine: Engine, monkeypatch, n: int,
                                                                      kwargs: dict) -> None:
    results = {}
    for ahead in (False, True):
        engine.reset()
        first, steps = _generate(engine, ahead, monkeypatch, PROMPT, n, **dict(kwargs))
        # the next turn continues the sequence: it reuses what the cache holds and must not see the difference
        follow = [*PROMPT, *first[0], 7, 9]
        results[ahead] = first, steps, _generate(engine, ahead, monkeypatch, follow, 6, ignore_eos=True)[0]
    (plain, plain_steps, plain_next), (ahead, ahead_steps, ahead_next) = results[False], results[True]
    assert ahead == plain and ahead_next == plain_next
    # a step past the last token only where the request ended before max_tokens (an EOG, a stop string)
    assert ahead_steps - plain_steps == (0 if plain[2] == "length" else 1 if len(plain[0]) < n - 1 else 0)


def test_a_consumer_that_stops_early_leaves_the_cache_consistent(engine: Engine, monkeypatch) -> None:
    monkeypatch.setattr(Engine, "GREEDY_AHEAD", True)
    engine.reset()
    gen = engine.generate(PROMPT, 20, GREEDY, ignore_eos=True)
    taken = []
    for step in gen.steps():
        taken.append(step.token)
        if len(taken) == 4:
            break
    assert engine.ops.submitted == engine.ops.taken  # the step in flight was waited for
    assert engine.kv.n_tokens == len(engine.kv_tokens) == len(PROMPT) + 4
    assert engine.kv_tokens == [*PROMPT, *taken]
    monkeypatch.setattr(Engine, "GREEDY_AHEAD", False)
    engine.reset()
    assert engine.generate(PROMPT, 4, GREEDY, ignore_eos=True).run().tokens == taken


def test_the_sync_chain_feeds_each_step_the_last_choice() -> None:
    """SyncGreedyChain: submit(None) reads the previous step's choice; takes come back in submit order."""

    class Scripted:
        def __init__(self) -> None:
            self.inputs: list[int] = []

        def decode_forward(self, model, token, kv, step):
            self.inputs.append(token)
            return [token], None

        def greedy_token(self, row):
            return None if row == 3 else row + 1

    ops = Scripted()
    chain = SyncGreedyChain(ops, None, None, None)
    chain.submit(1)
    chain.submit(None)
    assert chain.take() == 2
    chain.submit(None)
    chain.submit(None)  # after 3's non-finite logits: index 0, as the device leaves it
    assert [chain.take(), chain.take(), chain.take()] == [3, None, 1]
    assert ops.inputs == [1, 2, 3, 0]
