"""The prefill phase transaction: release decode state, run the prompt, restore, all or nothing.

Steps, in order: begin (only from ready, with exactly the configured slot count), quiesce,
invalidate graphs, release slots, release workspaces, reserve prefill buffers, prompt, free prefill
buffers, restore workspaces, restore slots (warm), restore graphs, end (only if the generation
counter is what begin saw and the slots are back). Any failure raises PhaseError naming the step,
marks the host unhealthy and leaves it so: nothing continues half restored until reset().
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Callable, TypeVar

from phase.cost import PhaseCostModel, PromptCost
from phase.errors import PhaseError
from phase.host import PhaseHost, WarmExperts

T = TypeVar("T")

STEPS = ("begin", "quiesce", "invalidate graphs", "release slots", "release workspaces", "reserve prefill buffers",
         "prompt", "free prefill buffers", "restore workspaces", "restore slots", "restore graphs", "end")


class _NotReady(Exception):
    """The state begin or end found is not the one the transaction requires."""


@dataclass
class PhaseCounters:
    begins: int = 0
    ends: int = 0
    failures: int = 0
    refused: int = 0  # asked to begin while unhealthy
    skipped: int = 0  # prompts the cost model ran without the transaction


@dataclass(frozen=True)
class PhaseRecord:
    tokens: int
    release_s: float  # quiesce .. reserve prefill buffers
    prompt_s: float
    restore_s: float  # free prefill buffers .. end
    warm_experts: int


class PrefillPhase:
    def __init__(self, host: PhaseHost, slots_per_layer: int, cost: PhaseCostModel | None = None,
                 logger: logging.Logger | None = None):
        self.host = host
        self.slots_per_layer = slots_per_layer
        self.cost = cost or PhaseCostModel()
        self.log = logger or logging.getLogger("phase")
        self.counters = PhaseCounters()
        self.last: PhaseRecord | None = None
        self.failed_step: str | None = None
        self._in_flight = False

    def pays(self, c: PromptCost) -> bool:
        """The cost model's verdict for one prompt; a prompt it skips is counted."""
        if self.cost.pays(c):
            return True
        self.counters.skipped += 1
        return False

    def run(self, n_tokens: int, prompt: Callable[[], T], warm: Callable[[], WarmExperts] | None = None) -> T:
        """Run `prompt()` inside the transaction and return what it returned."""
        h = self.host
        saw = self._step("begin", lambda: self._begin(n_tokens))
        t0 = time.perf_counter()
        self._step("quiesce", h.quiesce)
        self._step("invalidate graphs", h.invalidate_graphs)
        self._step("release slots", h.release_slots)
        self._step("release workspaces", h.release_workspaces)
        self._step("reserve prefill buffers", lambda: h.reserve_prefill_buffers(n_tokens))
        t1 = time.perf_counter()
        result = self._step("prompt", prompt)
        t2 = time.perf_counter()
        self._step("free prefill buffers", h.free_prefill_buffers)
        self._step("restore workspaces", h.restore_workspaces)
        chosen = self._step("restore slots", lambda: self._restore_slots(warm))
        self._step("restore graphs", h.restore_graphs)
        self._step("end", lambda: self._check_end(saw))
        t3 = time.perf_counter()
        self._in_flight = False
        self.counters.ends += 1
        self.last = PhaseRecord(n_tokens, t1 - t0, t2 - t1, t3 - t2, chosen)
        self.log.info("prefill phase end: %d tokens, release %.4f s, prompt %.4f s, restore %.4f s (%d warm experts)",
                      n_tokens, self.last.release_s, self.last.prompt_s, self.last.restore_s, chosen)
        return result

    def reset(self) -> None:
        """Bring the host back to ready after a failure (or check it is); PhaseError if it cannot."""
        try:
            self.host.recover()
        except Exception as exc:
            raise PhaseError(f"reset after a failed prefill phase did not recover the engine: {exc}") from exc
        if self.host.slot_count() != self.slots_per_layer:
            raise PhaseError(f"reset left {self.host.slot_count()} slots per layer, configured {self.slots_per_layer}")
        self._in_flight = False
        self.failed_step = None
        self.host.mark_healthy()

    def stats(self) -> dict:
        return {**asdict(self.counters), "last": asdict(self.last) if self.last else None,
                "failed_step": self.failed_step}

    # -- steps ------------------------------------------------------------------------------------
    def _begin(self, n_tokens: int) -> int:
        h = self.host
        if self._in_flight:
            raise _NotReady("another prefill phase is in flight")
        if h.slot_count() != self.slots_per_layer:
            raise _NotReady(f"the engine holds {h.slot_count()} cache slots per layer, configured "
                               f"{self.slots_per_layer}: not the ready state")
        self._in_flight = True
        self.counters.begins += 1
        saw = h.generation()
        self.log.info("prefill phase begin: %d tokens, generation %d, %d slots per layer", n_tokens, saw,
                      self.slots_per_layer)
        return saw

    def _restore_slots(self, warm: Callable[[], WarmExperts] | None) -> int:
        chosen = warm() if warm is not None else None
        self.host.restore_slots(chosen)
        return sum(len(v) for v in chosen.values()) if chosen else 0

    def _check_end(self, saw: int) -> None:
        now, slots = self.host.generation(), self.host.slot_count()
        if now != saw:
            raise _NotReady(f"the generation counter moved from {saw} to {now} during the phase "
                               f"(decode state was used or changed mid-prompt)")
        if slots != self.slots_per_layer:
            raise _NotReady(f"restored {slots} cache slots per layer, configured {self.slots_per_layer}")

    def _step(self, step: str, fn: Callable[[], T]) -> T:
        if step == "begin" and not self.host.healthy:
            self.counters.refused += 1
            raise PhaseError(f"prefill phase refused at step 'begin': the engine is unhealthy "
                             f"({self.host.unhealthy_reason}); reset it first")
        try:
            return fn()
        except Exception as exc:
            self.counters.failures += 1
            self.failed_step = step
            message = f"prefill phase failed at step '{step}': {exc or type(exc).__name__}"
            self.host.mark_unhealthy(message)
            self.log.error("%s", message)
            raise PhaseError(message) from exc
