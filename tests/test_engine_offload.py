"""The engine with routed experts offloaded (numpy backend, emulated device budget): same output, counted bytes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from phase import PhaseCostModel
from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.errors import CacheError, DeviceMemoryError, PhaseError
from runner.offload.offload import OffloadConfig

GREEDY = SamplingParams(temperature=0.0)
UBATCH = 8


def _engine(path, **offload) -> Engine:
    cfg = OffloadConfig(**{"cache_slots": 3, "prefill_ubatch": UBATCH, "transaction": "always", **offload})
    return Engine.load(path, EngineConfig(n_ctx=128, ubatch=UBATCH, offload=cfg))


@pytest.fixture(scope="module")
def path(synth_model):
    return synth_model("glm4moe", "Q8_0")


@pytest.fixture(scope="module")
def resident(path) -> Engine:
    return Engine.load(path, EngineConfig(n_ctx=128, ubatch=UBATCH))


def _greedy(engine: Engine, prompt: list[int], n: int = 12) -> list[int]:
    engine.reset()
    return engine.generate(prompt, n, GREEDY, ignore_eos=True).run().tokens


@pytest.mark.parametrize("order,policy", [("layer_major", "lru"), ("per_microbatch", "lfu")])
def test_greedy_output_with_3_of_8_slots_equals_the_all_resident_path(path, resident, order, policy) -> None:
    prompt = resident.tokenizer.encode("The expert cache must not change a single token of this reply")
    expected = _greedy(resident, prompt)
    assert len(set(expected)) > 3  # a continuation that says something
    engine = _engine(path, prefill_order=order, cache_policy=policy)
    assert _greedy(engine, prompt) == expected
    s = engine.stats()
    assert s["cache"]["total"]["misses"] > 0 and s["cache"]["total"]["evictions"] > 0  # the cache really worked
    assert s["phase"]["begins"] == s["phase"]["ends"] == 1 and s["healthy"]


def test_logits_all_with_offload_equals_the_resident_logits(path, resident) -> None:
    tokens = list(range(50, 90))
    assert np.array_equal(_engine(path).logits_all(tokens), resident.logits_all(tokens))


def test_stats_count_prompt_bytes_in_expert_sets_and_decode_hits_per_layer(path) -> None:
    engine = _engine(path, prefill_order="per_microbatch", warm_restore=False)
    prompt = list(range(100, 130))
    _greedy(engine, prompt, n=5)
    s = engine.stats()
    assert s["prefill"]["last_prompt"]["expert_sets"] == math.ceil(len(prompt) / UBATCH)
    assert s["prefill"]["last_prompt"]["bytes"] == s["prefill"]["expert_set_bytes"] * 4
    per_layer = s["cache"]["per_layer"]
    assert set(per_layer) == {1, 2, 3}  # the NextN block's experts have slots too
    for layer in (1, 2):  # 4 decode steps after the prompt, top-2 each: every use is a hit or a miss
        assert per_layer[layer]["hits"] + per_layer[layer]["misses"] == 4 * 2
    assert s["cache"]["total"]["warm_fills"] == 0


def test_warm_restore_refills_the_slots_with_the_experts_the_prompt_ended_on(path) -> None:
    engine = _engine(path)
    engine.prefill(list(range(200, 240)))
    stream_recent = engine.offload.stream.recent
    for layer in (1, 2):
        assert sorted(engine.offload.cache.held(layer)) == sorted(stream_recent[layer][:3])
    assert engine.stats()["cache"]["total"]["warm_fills"] == 6


def test_a_segmented_host_step_goes_through_the_cache_and_gets_the_views_addresses(path) -> None:
    offload = _engine(path).offload
    w, ids, generation = offload.store.weights(1), np.array([[3, 5]], dtype=np.int32), offload.generation()
    table = offload.fetch_pair_addresses(w, ids, np.zeros((3, 2), dtype=np.uint64))
    assert offload.generation() == generation + 1  # decode state in use, as fetch counts it
    c = offload.cache.counters[1]
    assert (c.hits, c.misses) == (0, 2)
    assert table[2].tolist() == [offload.cache.peek(1, e).down.ctypes.data for e in (3, 5)]
    offload.mark_unhealthy("injected")
    with pytest.raises(PhaseError, match="injected"):
        offload.fetch_pair_addresses(w, ids, table)


def test_the_cost_model_skips_the_transaction_for_a_short_tail_only(path, resident) -> None:
    engine = _engine(path, transaction="auto", phase_cost=PhaseCostModel(fixed_s=0.0))
    prompt = list(range(300, 340))
    engine.reset()
    first = engine.prefill(prompt)
    assert engine.stats()["phase"]["begins"] == 1
    tail = engine.prefill(prompt + [7])  # one new token: through the cache, no transaction
    s = engine.stats()["phase"]
    assert s["begins"] == 1 and s["skipped"] == 1
    resident.reset()
    assert np.array_equal(first, resident.prefill(prompt))
    np.testing.assert_allclose(tail, resident.prefill(prompt + [7]), atol=1e-5)


def test_a_high_decode_hit_rate_does_not_send_a_long_prompt_through_the_cache(path) -> None:
    """Decode's hit rate (one token per lookup, prefetch's hits counted) says nothing of a prompt's batches
    of slots // top-k tokens: on the 48-layer seed shape decode with prefetch hit 97.3%, the cost model
    took that for the 1k prompt (25 GB against the transaction's 60 GB) and it uploaded about 108 GB."""
    engine = _engine(path, transaction="auto", phase_cost=PhaseCostModel(fixed_s=0.0))
    offload = engine.offload
    offload.cache.counters[1].hits += 100_000  # as if decode had hit 99.99% since load
    assert offload.cache.total().hit_rate > 0.999
    k, one_each = engine.model_config.n_expert_used, sum(offload.store.expert_bytes(i) for i in offload.trunk_layers)
    cost = offload.prompt_cost(40)
    assert cost.bytes_without_phase == 40 * k * one_each  # no prompt through the cache yet: every pair a miss
    assert offload.phase.pays(cost)
    engine.prefill(list(range(300, 340)))
    s = engine.stats()
    assert s["phase"]["begins"] == 1 and s["phase"]["skipped"] == 0
    assert s["through_cache"]["prompts"] == 0


def test_prompts_through_the_cache_give_the_bytes_per_token_the_cost_model_expects(path) -> None:
    engine = _engine(path, transaction="never")
    before = engine.stats()["cache"]["total"]
    engine.prefill(list(range(400, 460)))
    s = engine.stats()
    seen, cache = s["through_cache"], s["cache"]["total"]
    assert seen["prompts"] == 1 and seen["tokens"] == 60
    assert seen["hits"] == cache["hits"] - before["hits"] and seen["misses"] == cache["misses"] - before["misses"]
    assert 0 < seen["bytes_uploaded"] == cache["bytes_uploaded"] - before["bytes_uploaded"]
    assert engine.offload.prompt_cost(600).bytes_without_phase == 600 * seen["bytes_uploaded"] // 60


def test_never_runs_every_prompt_through_the_cache_in_batches_that_fit_the_slots(path, resident) -> None:
    engine = _engine(path, transaction="never")
    prompt = list(range(400, 420))
    got = engine.prefill(prompt)
    resident.reset()
    np.testing.assert_allclose(got, resident.prefill(prompt), atol=1e-4)
    s = engine.stats()
    assert s["phase"]["begins"] == 0 and s["phase"]["skipped"] == 1 and s["prefill"]["total"]["bytes"] == 0


def test_slots_and_prefill_buffers_never_share_the_budget(path) -> None:
    engine = _engine(path)
    budget = engine.offload.budget
    seen: list[set[str]] = []
    reserve = budget.reserve

    def spy(what: str, nbytes: int) -> None:
        reserve(what, nbytes)
        seen.append(set(budget.held))

    budget.reserve = spy  # type: ignore[method-assign]
    engine.prefill(list(range(10, 50)))
    del budget.reserve
    def cache(held) -> bool:
        return any(what.startswith("expert cache (3 slots per layer)") for what in held)

    assert seen and all(not (cache(held) and "prefill staging A" in held) for held in seen)
    assert cache(budget.held) and "prefill staging A" not in budget.held and "decode workspaces" in budget.held
    assert budget.peak_bytes <= budget.limit_bytes


def test_a_failed_restore_leaves_the_engine_refusing_work_until_reset(path, resident) -> None:
    engine = _engine(path)
    cache = engine.offload.cache
    real_restore = cache.restore

    def broken(warm=None):
        raise DeviceMemoryError("expert cache (3 slots per layer) needs 0.01 GiB but only 0.00 GiB ... is free")

    cache.restore = broken  # type: ignore[method-assign]
    prompt = list(range(60, 80))
    with pytest.raises(PhaseError, match="step 'restore slots'"):
        engine.prefill(prompt)
    cache.restore = real_restore  # type: ignore[method-assign]
    for work in (lambda: engine.prefill(prompt), lambda: engine.decode(5),
                 lambda: engine.generate(prompt, 2, GREEDY).run()):
        with pytest.raises(PhaseError, match="unhealthy"):
            work()
    assert not engine.stats()["healthy"] and engine.stats()["phase"]["failed_step"] == "restore slots"
    engine.reset()
    assert engine.stats()["healthy"] and engine.offload.cache.held_slots == 3
    assert "prefill staging A" not in engine.offload.budget.held
    assert _greedy(engine, prompt, 6) == _greedy(resident, prompt, 6)


def answers(*steps):
    """A prefill's `cancelled` that answers each call with the next of `steps`, raising one that is an exception
    (a fault inside the prompt, where the model asks between layers or micro-batches)."""
    calls = iter(steps)

    def cancelled():
        step = next(calls)
        if isinstance(step, Exception):
            raise step
        return step
    return cancelled


def test_an_exception_inside_the_prompt_fails_the_phase_and_reset_recovers(path) -> None:
    engine = _engine(path)
    with pytest.raises(PhaseError, match="step 'prompt': kernel fault"):
        engine.prefill(list(range(30)), cancelled=answers(False, RuntimeError("kernel fault")))
    with pytest.raises(PhaseError):
        engine.decode(3)
    engine.reset()
    assert engine.prefill(list(range(30))) is not None


def test_too_many_slots_for_the_budget_is_a_start_up_error(path) -> None:
    with pytest.raises(CacheError, match=r"--cache-slots 8 needs .* at most \d+ slots per layer fit"):
        _engine(path, cache_slots=8, vram_budget_bytes=7 << 20)
    small = _engine(path, cache_slots="auto", vram_budget_bytes=7 << 20)
    assert 1 <= small.offload.cache.slots_per_layer < 8


def test_a_prompt_through_the_cache_runs_in_batches_the_decode_workspaces_hold(synth_model) -> None:
    """Without the transaction a prompt goes through the slots; however many slots there are, a forward
    takes at most SMALL_BATCH_ROWS tokens (on CUDA larger ones need prefill scratch that the budget does not
    keep outside the transaction: the 48-layer seed shape ran out of memory at --cache-slots auto)."""
    from runner.backends.limits import SMALL_BATCH_ROWS

    path = synth_model("glm4moe", "Q8_0", experts=32)
    cfg = OffloadConfig(cache_slots=32, prefill_ubatch=UBATCH, transaction="never")
    engine = Engine.load(path, EngineConfig(n_ctx=128, ubatch=64, offload=cfg))
    k = engine.model_config.n_expert_used
    assert 32 // k > SMALL_BATCH_ROWS  # the slots alone would allow bigger forwards
    sizes: list[int] = []
    forward = engine.model.forward
    engine.model.forward = lambda tokens, kv, **kw: sizes.append(len(tokens)) or forward(tokens, kv, **kw)
    prompt = list(range(3, 40))
    engine.prefill(prompt)
    assert sizes == [SMALL_BATCH_ROWS] * (len(prompt) // SMALL_BATCH_ROWS) + [len(prompt) % SMALL_BATCH_ROWS]
    assert engine.offload.cache_batch(64) == SMALL_BATCH_ROWS and engine.offload.cache_batch(3) == 3


def test_the_cost_model_gets_the_measured_decode_step_and_the_forwards_a_prompt_would_take(path) -> None:
    engine = _engine(path, transaction="auto")
    assert engine.offload.prompt_cost(40).forward_s == 0.0  # nothing measured yet: bytes decide
    engine.generate(list(range(3, 20)), 6, GREEDY, ignore_eos=True).run()
    step = engine.stats()["phase"]["decode_step_s"]
    assert step > 0.0
    cost = engine.offload.prompt_cost(40)
    assert cost.forward_s == step
    assert cost.forwards_without == math.ceil(40 / engine.offload.cache_batch()) > 1


def test_prefill_buffers_that_cannot_fit_even_released_are_a_start_up_error(path) -> None:
    with pytest.raises(CacheError, match="prefill buffers for --prefill-ubatch 100000"):
        _engine(path, cache_slots=2, prefill_ubatch=100_000, vram_budget_bytes=7 << 20)


def test_a_profile_becomes_offload_settings_whose_cache_serves_a_verify_batch() -> None:
    from runner.launch.profiles import load_profile
    from runner.offload.offload import offload_config

    cfg = offload_config(load_profile("home-24g").launch)
    assert (cfg.cache_slots, cfg.prefill_ubatch, cfg.vram_budget_bytes, cfg.decode_batch) == (150, 2048, 24 * 2**30, 4)


class _RowInvariantNumpyOps(NumpyOps):
    """NumpyOps claiming row-invariant prompt products (as CUDA's are), to see the offload group micro-batches."""

    row_invariant_prompts = True


def test_layer_major_groups_micro_batches_only_where_products_are_row_invariant(path) -> None:
    from runner.backends.limits import PROMPT_FFN_GROUP_TOKENS

    assert _engine(path).offload.ffn_group_tokens == UBATCH  # numpy's BLAS: micro-batch by micro-batch
    assert _engine(path, prefill_order="per_microbatch").offload.ffn_group_tokens == UBATCH
    cfg = OffloadConfig(cache_slots=3, prefill_ubatch=UBATCH, transaction="always")
    grouped = Engine.load(path, EngineConfig(n_ctx=128, ubatch=UBATCH, offload=cfg), ops=_RowInvariantNumpyOps())
    assert grouped.offload.ffn_group_tokens == PROMPT_FFN_GROUP_TOKENS
    prompt = list(range(40, 75))
    np.testing.assert_allclose(grouped.logits_all(prompt), _engine(path).logits_all(prompt), rtol=0, atol=1e-3)
