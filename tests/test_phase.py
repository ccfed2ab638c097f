"""The prefill phase transaction: its order, its all-or-nothing rules, fault injection, the cost model."""

from __future__ import annotations

import logging

import pytest

from phase import STEPS, PhaseCostModel, PrefillPhase, PromptCost
from runner.errors import DeviceMemoryError, PhaseError

SLOTS = 150


class FakeHost:
    """Records every call; `fail[step]` makes that step raise."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail: dict[str, Exception] = {}
        self.slots = SLOTS
        self.gen = 7
        self.healthy = True
        self.unhealthy_reason: str | None = None
        self.warm = None

    def _do(self, step: str) -> None:
        self.calls.append(step)
        if step in self.fail:
            raise self.fail[step]

    def mark_unhealthy(self, reason: str) -> None:
        self.healthy, self.unhealthy_reason = False, reason

    def mark_healthy(self) -> None:
        self.healthy, self.unhealthy_reason = True, None

    def generation(self) -> int:
        return self.gen

    def slot_count(self) -> int:
        return self.slots

    def quiesce(self) -> None:
        self._do("quiesce")

    def invalidate_graphs(self) -> None:
        self._do("invalidate graphs")

    def release_slots(self) -> None:
        self._do("release slots")
        self.slots = 0

    def release_workspaces(self) -> None:
        self._do("release workspaces")

    def reserve_prefill_buffers(self, n_tokens: int) -> None:
        self._do("reserve prefill buffers")

    def free_prefill_buffers(self) -> None:
        self._do("free prefill buffers")

    def restore_workspaces(self) -> None:
        self._do("restore workspaces")

    def restore_slots(self, warm) -> None:
        self._do("restore slots")
        self.warm = warm
        self.slots = SLOTS

    def restore_graphs(self) -> None:
        self._do("restore graphs")

    def recover(self) -> None:
        self._do("recover")
        self.slots = SLOTS


def _prompt(host: FakeHost, result="logits"):
    def run():
        host.calls.append("prompt")
        if "prompt" in host.fail:
            raise host.fail["prompt"]
        return result
    return run


def test_a_phase_runs_every_step_in_order_and_logs_its_markers(caplog) -> None:
    host = FakeHost()
    phase = PrefillPhase(host, SLOTS)
    with caplog.at_level(logging.INFO, logger="phase"):
        out = phase.run(4096, _prompt(host), warm=lambda: {1: [3, 4], 2: [5]})
    assert out == "logits"
    assert host.calls == [s for s in STEPS if s not in ("begin", "end")]
    assert host.warm == {1: [3, 4], 2: [5]}
    assert (phase.counters.begins, phase.counters.ends, phase.counters.failures) == (1, 1, 0)
    assert phase.last is not None and phase.last.tokens == 4096 and phase.last.warm_experts == 3
    assert phase.last.release_s >= 0 and phase.last.restore_s >= 0
    assert "prefill phase begin: 4096 tokens" in caplog.text and "prefill phase end: 4096 tokens, release" in caplog.text


def _assert_failed_and_refuses_until_reset(host: FakeHost, phase: PrefillPhase, step: str) -> None:
    assert not host.healthy and f"step '{step}'" in host.unhealthy_reason
    assert phase.counters.failures == 1 and phase.failed_step == step
    with pytest.raises(PhaseError, match="refused at step 'begin': the engine is unhealthy"):
        phase.run(10, _prompt(host))
    assert phase.counters.refused == 1
    host.fail.clear()
    phase.reset()
    assert host.healthy and host.calls[-1] == "recover"
    assert phase.run(10, _prompt(host)) == "logits"


@pytest.mark.parametrize("step", ["quiesce", "invalidate graphs", "release slots", "release workspaces",
                                  "free prefill buffers", "restore workspaces", "restore graphs"])
def test_a_failing_step_is_named_and_nothing_after_it_runs(step) -> None:
    host = FakeHost()
    host.fail[step] = RuntimeError("injected")
    phase = PrefillPhase(host, SLOTS)
    with pytest.raises(PhaseError, match=f"prefill phase failed at step '{step}': injected"):
        phase.run(100, _prompt(host))
    assert host.calls[-1] == step
    _assert_failed_and_refuses_until_reset(host, phase, step)


def test_a_prefill_buffer_allocation_failure_names_the_step() -> None:
    host = FakeHost()
    host.fail["reserve prefill buffers"] = DeviceMemoryError("prefill staging A needs 1.80 GiB but only 0.50 GiB ...")
    phase = PrefillPhase(host, SLOTS)
    with pytest.raises(PhaseError, match="step 'reserve prefill buffers': prefill staging A needs 1.80 GiB"):
        phase.run(100, _prompt(host))
    assert "prompt" not in host.calls
    _assert_failed_and_refuses_until_reset(host, phase, "reserve prefill buffers")


def test_an_exception_inside_the_prompt_fails_the_phase_without_restoring() -> None:
    host = FakeHost()
    host.fail["prompt"] = ValueError("kernel exploded")
    phase = PrefillPhase(host, SLOTS)
    with pytest.raises(PhaseError, match="step 'prompt': kernel exploded") as err:
        phase.run(100, _prompt(host))
    assert isinstance(err.value.__cause__, ValueError)
    assert host.calls[-1] == "prompt" and "restore slots" not in host.calls
    _assert_failed_and_refuses_until_reset(host, phase, "prompt")


def test_a_failure_during_restore_leaves_the_engine_unhealthy() -> None:
    host = FakeHost()
    host.fail["restore slots"] = DeviceMemoryError("expert cache (150 slots per layer) needs 12.5 GiB")
    phase = PrefillPhase(host, SLOTS)
    with pytest.raises(PhaseError, match="step 'restore slots': expert cache"):
        phase.run(100, _prompt(host))
    _assert_failed_and_refuses_until_reset(host, phase, "restore slots")


def test_a_failing_warm_choice_fails_the_restore_step() -> None:
    host = FakeHost()
    phase = PrefillPhase(host, SLOTS)
    with pytest.raises(PhaseError, match="step 'restore slots'"):
        phase.run(100, _prompt(host), warm=lambda: 1 / 0)
    _assert_failed_and_refuses_until_reset(host, phase, "restore slots")


def test_a_generation_counter_that_moved_mid_prompt_fails_the_end() -> None:
    host = FakeHost()
    phase = PrefillPhase(host, SLOTS)

    def prompt():
        host.gen += 1  # a decode step sneaked in
        return "logits"

    with pytest.raises(PhaseError, match="step 'end': the generation counter moved from 7 to 8"):
        phase.run(100, prompt)
    assert phase.counters.ends == 0
    _assert_failed_and_refuses_until_reset(host, phase, "end")


def test_restoring_the_wrong_slot_count_fails_the_end() -> None:
    host = FakeHost()
    phase = PrefillPhase(host, SLOTS)
    host.restore_slots = lambda warm: host.calls.append("restore slots")  # type: ignore[method-assign]
    with pytest.raises(PhaseError, match="step 'end': restored 0 cache slots per layer, configured 150"):
        phase.run(100, _prompt(host))
    del host.restore_slots
    _assert_failed_and_refuses_until_reset(host, phase, "end")


def test_begin_requires_exactly_the_configured_slot_count() -> None:
    host = FakeHost()
    host.slots = 149
    phase = PrefillPhase(host, SLOTS)
    with pytest.raises(PhaseError, match="step 'begin': the engine holds 149 cache slots per layer, configured 150"):
        phase.run(100, _prompt(host))
    assert host.calls == [] and phase.counters.begins == 0
    _assert_failed_and_refuses_until_reset(host, phase, "begin")


def test_a_reset_that_cannot_recover_keeps_the_engine_unhealthy() -> None:
    host = FakeHost()
    host.fail["prompt"] = ValueError("boom")
    phase = PrefillPhase(host, SLOTS)
    with pytest.raises(PhaseError):
        phase.run(100, _prompt(host))
    host.fail["recover"] = DeviceMemoryError("no room")
    with pytest.raises(PhaseError, match="did not recover the engine: no room"):
        phase.reset()
    assert not host.healthy


def test_cost_model_skips_short_tails_and_runs_long_prompts() -> None:
    set_bytes, expert_bytes, top_k, layers = 900 << 20, 1_800_000, 10, 47
    model = PhaseCostModel(fixed_s=0.02, h2d_bytes_per_s=55e9)

    def cost(n: int) -> PromptCost:
        without = n * top_k * expert_bytes * layers * 0.7  # decode-sized batches at a 30% hit rate
        return PromptCost(n, bytes_with_phase=set_bytes * layers, bytes_without_phase=int(without))

    assert not model.pays(cost(30))
    assert model.pays(cost(2048))
    phase = PrefillPhase(FakeHost(), SLOTS, model)
    assert not phase.pays(cost(30)) and phase.pays(cost(4096)) and phase.counters.skipped == 1
    assert model.seconds_with(cost(1)) == pytest.approx(0.02 + set_bytes * layers / 55e9)


def test_forwards_through_the_cache_count_where_bytes_alone_would_skip_the_transaction() -> None:
    """The 48-layer seed shape at a 97% hit rate: a 1k prompt misses fewer bytes through the cache than
    one expert set plus the warm refill, but takes 128 forwards of 8 tokens, each at least a decode step."""
    model = PhaseCostModel(fixed_s=0.02, h2d_bytes_per_s=55e9)
    n, with_bytes, one_each = 1024, 59_000_000_000, 89_400_000
    without = int(n * 10 * one_each * 0.03)
    bytes_only = PromptCost(n, with_bytes, without)
    assert not model.pays(bytes_only)
    measured = PromptCost(n, with_bytes, without, forwards_without=128, forward_s=0.015)
    assert model.pays(measured)
    assert model.seconds_without(measured) == pytest.approx(without / 55e9 + 128 * 0.015)
    short = PromptCost(12, with_bytes, int(12 * 10 * one_each * 0.03), forwards_without=2, forward_s=0.015)
    assert not model.pays(short)  # a chat turn still skips it
