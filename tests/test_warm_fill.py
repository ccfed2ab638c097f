"""Warm fill from staging (OffloadConfig.warm_fill="staging"), numpy backend on the emulated device arena:
the same warm slots and tokens as the host restore, no PCIe bytes for them, a counted fallback when the
budget cannot hold slots beside the prompt's buffers, and a failed prompt's fills never trusted."""

from __future__ import annotations

import numpy as np
import pytest
from test_engine_offload import answers

from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.errors import CacheError, PhaseError
from runner.offload.offload import OffloadConfig
from runner.offload.sizing import staging_bytes
from runner.spec.config import DraftConfig

GREEDY = SamplingParams(temperature=0.0)
UBATCH = 8
N_CTX = 128
PROMPT = list(range(200, 240))


def _engine(path, **offload) -> Engine:
    cfg = OffloadConfig(**{"cache_slots": 3, "prefill_ubatch": UBATCH, "transaction": "always", **offload})
    return Engine.load(path, EngineConfig(n_ctx=N_CTX, ubatch=UBATCH, offload=cfg))


@pytest.fixture(scope="module")
def path(synth_model):
    return synth_model("glm4moe", "Q8_0")


def _slots(engine: Engine) -> dict[int, list[int]]:
    """Per MoE layer the held experts, least recently used first (the LRU policy's order)."""
    cache = engine.offload.cache
    return {i: list(cache._layers[i].policy._order) for i in cache.store.layers}


def _greedy(engine: Engine, prompt: list[int], n: int = 10, draft: DraftConfig | None = None) -> list[int]:
    engine.reset()
    return engine.generate(prompt, n, GREEDY, ignore_eos=True, draft=draft).run().tokens


def test_warm_fill_must_be_host_or_staging() -> None:
    with pytest.raises(CacheError, match="warm_fill must be host or staging"):
        OffloadConfig(warm_fill="pcie")  # type: ignore[arg-type]


@pytest.mark.parametrize("order", ["layer_major", "per_microbatch"])
def test_staging_fill_leaves_the_slots_the_host_restore_would_with_no_restore_upload(path, order) -> None:
    host, staged = _engine(path, prefill_order=order), _engine(path, prefill_order=order, warm_fill="staging")
    host.prefill(PROMPT)
    uploaded_before = staged.offload.arena.bytes_uploaded
    staged.prefill(PROMPT)
    assert _slots(staged) == _slots(host) and all(_slots(host)[i] for i in (1, 2))
    s, h = staged.stats(), host.stats()
    warm_set_bytes = h["cache"]["total"]["warm_bytes"]
    assert warm_set_bytes == 2 * 3 * staged.offload.store.expert_bytes(1)  # layers 1 and 2, three slots each
    assert s["cache"]["total"]["warm_bytes"] == 0  # nothing re-uploaded from the host
    assert s["cache"]["total"]["warm_device_bytes"] == warm_set_bytes == staged.offload.arena.bytes_copied
    assert h["cache"]["total"]["warm_device_bytes"] == 0 and host.offload.arena.bytes_copied == 0
    # the PCIe bytes of the prompt are the stream's alone
    assert staged.offload.arena.bytes_uploaded - uploaded_before == s["prefill"]["last_prompt"]["bytes"]
    assert s["prefill"]["warm_fill"] == {"mode": "staging", "staged": 1, "fallbacks": 0, "partial": 0, "last_fallback": None}
    assert s["phase"]["ends"] == 1 and s["healthy"]
    assert "prefill staging A" not in staged.offload.budget.held  # buffers freed, slots kept


def test_greedy_tokens_with_staging_fill_equal_the_host_restores(path) -> None:
    prompt = list(range(300, 341))
    host, staged = _engine(path), _engine(path, warm_fill="staging")
    expected = _greedy(host, prompt)
    assert _greedy(staged, prompt) == expected
    assert staged.stats()["cache"]["total"]["hits"] == host.stats()["cache"]["total"]["hits"]  # same decode traffic


def test_the_nextn_layer_fills_from_staging_after_its_catch_up(path) -> None:
    draft = DraftConfig("mtp", 2, adaptive=False)
    prompt = list(range(400, 437))
    host, staged = (_engine(path, cache_slots=6, decode_batch=3),
                    _engine(path, cache_slots=6, decode_batch=3, warm_fill="staging"))
    assert _greedy(staged, prompt, draft=draft) == _greedy(host, prompt, draft=draft)
    nextn = max(staged.offload.store.layers)
    assert staged.offload.cache.counters[nextn].warm_device_fills > 0  # the tail's layer was filled, not uploaded
    assert staged.offload.cache.counters[nextn].warm_fills == 0


def test_a_budget_without_room_for_slots_beside_the_buffers_falls_back_to_the_host_restore(path) -> None:
    probe = _engine(path, warm_fill="staging").offload
    ready = probe.budget.used_bytes
    prompt_use = (ready - probe.cache.nbytes - probe.backend.workspaces.nbytes + staging_bytes(probe.store)
                  + probe._prefill_buffer_bytes(N_CTX))
    limit = max(ready, prompt_use)  # enough for decode and for any prompt, not for slots beside a prompt
    assert limit < prompt_use + probe.cache.nbytes
    host, tight = _engine(path), _engine(path, warm_fill="staging", vram_budget_bytes=limit)
    host.prefill(PROMPT)
    tight.prefill(PROMPT)
    fill = tight.stats()["prefill"]["warm_fill"]
    assert (fill["staged"], fill["fallbacks"]) == (0, 1) and "restored from the host" in fill["last_fallback"]
    assert _slots(tight) == _slots(host)
    assert tight.stats()["cache"]["total"]["warm_bytes"] == host.stats()["cache"]["total"]["warm_bytes"] > 0
    assert tight.offload.arena.bytes_copied == 0
    assert tight.offload.budget.peak_bytes <= limit
    # the cost model knows: a prompt that will fall back pays the refill over PCIe, one that fills does not
    warm = sum(probe.cache.layer_slots(i) * probe.store.expert_bytes(i) for i in probe.trunk_layers)
    host_cost = host.offload.prompt_cost(len(PROMPT)).bytes_with_phase
    assert tight.offload.prompt_cost(len(PROMPT)).bytes_with_phase == host_cost
    assert probe.prompt_cost(len(PROMPT)).bytes_with_phase == host_cost - warm


def test_room_for_some_layers_slots_fills_those_from_staging_and_restores_the_rest_from_the_host(path) -> None:
    """The cache is reserved in groups of layers (one layer each here): with room beside the prompt for the
    first group only, that layer fills device to device and the others cross from the host; slots, tokens
    and the total warm bytes are the host restore's."""
    probe = _engine(path, warm_fill="staging").offload
    cache = probe.cache
    assert cache.groups == [[1], [2], [3]] and sum(map(cache.group_bytes, range(3))) == cache.nbytes
    ready = probe.budget.used_bytes
    prompt_use = (ready - cache.nbytes - probe.backend.workspaces.nbytes + staging_bytes(probe.store)
                  + probe._prefill_buffer_bytes(N_CTX))
    limit = prompt_use + cache.group_bytes(0) + cache.group_bytes(1) // 2  # the first group fits, not the second
    assert limit >= ready
    host, tight = _engine(path), _engine(path, warm_fill="staging", vram_budget_bytes=limit)
    host_tokens, tight_tokens = _greedy(host, PROMPT), _greedy(tight, PROMPT)
    assert tight_tokens == host_tokens
    fill = tight.stats()["prefill"]["warm_fill"]
    assert (fill["staged"], fill["fallbacks"], fill["partial"]) == (1, 1, 1)
    assert "the slots of 1 of 3 MoE layers" in fill["last_fallback"]
    c, h = tight.offload.cache.counters, host.offload.cache.counters
    assert (c[1].warm_device_fills, c[1].warm_fills) == (3, 0) and c[2].warm_device_fills == c[3].warm_device_fills == 0
    assert c[2].warm_fills == h[2].warm_fills > 0
    tight.prefill(PROMPT)
    host.prefill(PROMPT)
    assert _slots(tight) == _slots(host)
    assert tight.offload.budget.peak_bytes <= limit and tight.offload.cache.held_slots == 3
    # the cost model counts the part that crosses: less than a whole refill, more than none
    warm = sum(cache.layer_slots(i) * probe.store.expert_bytes(i) for i in probe.trunk_layers)
    host_cost = host.offload.prompt_cost(len(PROMPT)).bytes_with_phase
    assert host_cost - warm < tight.offload.prompt_cost(len(PROMPT)).bytes_with_phase < host_cost


def test_a_failure_after_a_layer_filled_drops_its_slots_and_reset_recovers(path) -> None:
    engine, host = _engine(path, warm_fill="staging"), _engine(path)
    cancelled = answers(False, False, RuntimeError("kernel fault"))  # layer_major asks before layers 0, 1, 2
    with pytest.raises(PhaseError, match="step 'prompt': kernel fault"):
        engine.prefill(PROMPT, cancelled=cancelled)
    assert engine.offload.cache.counters[1].warm_device_fills == 3  # layer 1 had filled before the fault
    with pytest.raises(PhaseError):
        engine.decode(3)
    engine.reset()
    cache = engine.offload.cache
    assert all(cache.held(i) == [] for i in cache.store.layers)  # the fills are not trusted: a cold cache
    assert engine.stats()["healthy"] and "prefill staging A" not in engine.offload.budget.held
    prompt = list(range(100, 130))
    assert _greedy(engine, prompt) == _greedy(host, prompt)
    host.prefill(PROMPT)
    engine.prefill(PROMPT)
    assert _slots(engine) == _slots(host)


def _cancelled_before_layer(n: int):
    """A cancelled() that says yes when layer_major asks before layer n."""
    calls = iter(range(n + 1))
    return lambda: next(calls) == n


def test_a_cancelled_prompt_keeps_the_filled_layers_and_uploads_the_others(path) -> None:
    host, staged = _engine(path), _engine(path, warm_fill="staging")
    assert host.prefill(PROMPT, cancelled=_cancelled_before_layer(2)) is None
    assert staged.prefill(PROMPT, cancelled=_cancelled_before_layer(2)) is None  # layer 1 filled, 2 never ran
    assert _slots(staged) == _slots(host)
    c = staged.offload.cache.counters
    assert (c[1].warm_device_fills, c[1].warm_fills, c[2].warm_device_fills) == (3, 0, 0)


def test_fill_from_staging_refuses_outside_a_prompts_fill(path) -> None:
    offload = _engine(path, warm_fill="staging").offload
    with pytest.raises(CacheError, match="outside a prompt's fill"):
        offload.cache.fill_from_staging(1, [0, 1], offload.cache.regions[0])
    assert offload.cache.held(1) == []


@pytest.mark.parametrize("warm_1", [[5, 2, 7], [4, 2, 7]])  # the fill's own list, then one that disagrees
def test_restore_keeps_a_fill_equal_to_the_warm_list_and_uploads_any_other(path, warm_1) -> None:
    staged, host = _engine(path).offload, _engine(path).offload
    cache, store, arena = staged.cache, staged.store, staged.arena
    staging = arena.reserve("test staging", store.layer_bytes(1))
    arena.upload(staging, 0, store.experts(1, 0, store.n_expert(1)))
    cache.release()
    cache.reserve_for_fill()
    cache.fill_from_staging(1, [5, 2, 7, 5, 1], staging)  # repeats dropped, cut to the 3 slots
    uploaded = arena.bytes_uploaded
    warm = {1: warm_1, 2: [1, 0, 3]}
    cache.restore(warm)
    host.cache.release()
    host.cache.restore(warm)
    for i in store.layers:
        assert list(cache._layers[i].policy._order) == list(host.cache._layers[i].policy._order)
        assert all(np.array_equal(cache.peek(i, e).down, host.cache.peek(i, e).down) for e in cache.held(i))
    kept = warm_1 == [5, 2, 7]
    eb = store.expert_bytes(1)
    assert arena.bytes_uploaded - uploaded == (3 if kept else 6) * eb  # layer 2 always; layer 1 only if it disagreed
    with pytest.raises(CacheError, match="already reserved"):
        cache.restore(warm)  # a plain restore of a reserved cache is refused, as before
