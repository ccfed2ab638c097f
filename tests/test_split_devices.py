"""--devices on the numpy backend: two emulated cards, each with its own budget, the hidden state moved between."""

from __future__ import annotations

import pytest

from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.errors import DeviceMemoryError
from runner.gguf_file import open_gguf
from runner.launch.devices import PlanCosts, SplitConfig, plan_devices
from runner.models.config import model_config
from runner.spec.config import DraftConfig

GREEDY = SamplingParams(temperature=0.0)
UBATCH = 8
N_CTX = 128


@pytest.fixture(scope="module", params=["glm4moe", "qwen35moe"])
def path(request, synth_model):
    return synth_model(request.param, "Q8_0")


def _costs(path) -> PlanCosts:
    f = open_gguf(path)
    return SplitConfig((0, 1), 1 << 40, slots=2, rows=UBATCH).plan(f, model_config(f), N_CTX)[1]


def _one_card_need(path) -> int:
    """The bytes the split engine places on one card when it holds every layer."""
    costs = _costs(path)
    return sum(layer.total for layer in costs.layers) + costs.embedding + costs.head + costs.workspace


def _greedy(engine: Engine, prompt: list[int], n: int = 10) -> list[int]:
    engine.reset()
    return engine.generate(prompt, n, GREEDY, ignore_eos=True).run().tokens


def test_a_model_too_big_for_one_budget_runs_on_two_with_the_same_tokens(path) -> None:
    # the fullest card of the best split over two unbounded cards: less than one card would need
    budget = max(s.used_bytes for s in plan_devices((0, 1), [1 << 40] * 2, _costs(path)).shares)
    assert budget < _one_card_need(path)
    with pytest.raises(DeviceMemoryError, match="1 card of"):
        plan_devices((0,), [budget], _costs(path))
    one = Engine.load(path, EngineConfig(n_ctx=N_CTX, ubatch=UBATCH))
    two = Engine.load(path, EngineConfig(n_ctx=N_CTX, ubatch=UBATCH, split=SplitConfig((0, 1), budget, slots=2, rows=UBATCH)))
    prompt = list(range(3, 22))  # 19 tokens: three micro-batches, the last one short
    assert _greedy(two, prompt) == _greedy(one, prompt)
    assert two.devices is not None and two.stats() == {}
    stats = two.devices.stats()
    assert stats["split"].startswith("layers 0-")
    for card in stats["devices"]:
        assert 0 < card["peak_bytes"] <= card["limit_bytes"] == budget
    # one move per forward: three prefill chunks and a decode step per token after the first
    assert stats["transfers"] == 3 + 9
    assert stats["transfer_bytes"] == (19 + 9) * two.model_config.n_embd * 4


def test_logits_equal_the_single_card_engine_bit_for_bit(path) -> None:
    split = SplitConfig((0, 1), _one_card_need(path), slots=2, rows=UBATCH)
    one = Engine.load(path, EngineConfig(n_ctx=N_CTX, ubatch=UBATCH))
    two = Engine.load(path, EngineConfig(n_ctx=N_CTX, ubatch=UBATCH, split=split))
    tokens = list(range(5, 25))
    assert (one.logits_all(tokens) == two.logits_all(tokens)).all()


def test_every_layer_is_reserved_on_exactly_one_card(path) -> None:
    engine = Engine.load(path, EngineConfig(n_ctx=N_CTX, ubatch=UBATCH,
                                            split=SplitConfig((0, 1), _one_card_need(path), slots=2, rows=UBATCH)))
    assert engine.devices is not None
    first, second = engine.devices.budgets
    n = engine.model_config.n_layer
    for i in range(n):
        assert (f"blk.{i} kv" in first.held) != (f"blk.{i} kv" in second.held)
    assert "token embedding" in first.held and "output head" in second.held
    assert "hidden state from cuda:0" in second.held


def test_mtp_drafting_on_two_cards_gives_the_plain_tokens(synth_model) -> None:
    path = synth_model("glm4moe", "Q8_0")
    split = SplitConfig((0, 1), 24 << 30, slots=None, rows=2)  # every expert on its layer's card
    engine = Engine.load(path, EngineConfig(n_ctx=N_CTX, ubatch=2, split=split))  # verify batches beyond ubatch
    prompt = list(range(7, 20))
    plain = _greedy(engine, prompt)
    engine.reset()
    drafted = engine.generate(prompt, 10, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 3)).run()
    assert drafted.tokens == plain
    assert drafted.draft is not None and drafted.draft.drafted_n >= 3  # verify batches of more than 2 rows ran
