"""The context a launch runs with, and why.

`-c N` is taken as given (cut to the model's context_length, as the engine cuts it) and refused in one
line when the launch cannot hold its KV cache. Without it the context is llama.cpp's default: the
model's context_length, capped by what the VRAM budget leaves the KV cache once everything else the
launch keeps on the card is placed (llama.cpp's `--fit`, rounded down to 256 as it rounds); a hybrid's
K/V is per token in its attention layers only, its DeltaNet state a fixed size beside the weights. A launch
whose expert slots take whatever the budget leaves (`--cache-slots auto`) keeps the context at
llama.cpp's `--fit-ctx` floor of 4096 instead: like llama.cpp, it keeps more of the model on the GPU
rather than reserve context nobody asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from runner.backends.kv_type import DEFAULT_KV_TYPE
from runner.engine.hybrid_cache import DEVICE_STATE_SETS
from runner.errors import DeviceMemoryError
from runner.offload.sizing import (
    AUTO_HEADROOM,
    attention_partials_bytes_per_position,
    decode_workspace_bytes,
    kv_bytes_per_token,
    min_slots,
    prefill_workspace_bytes,
    prompt_hidden_bytes,
    recurrent_state_bytes,
    staging_bytes,
)
from runner.units import size_text

if TYPE_CHECKING:
    from runner.gguf_file import GGUFFile
    from runner.models.config import ModelConfig
    from runner.offload.offload import OffloadConfig

FIT_CTX_MIN = 4096  # llama.cpp's --fit-ctx default: the context a launch that fills the card with slots keeps
CTX_ALIGN = 256  # a context cut to fit the budget is a multiple of this (llama.cpp's fit rounds the same)


@dataclass(frozen=True)
class DeviceState:
    """What one state of the launch holds on the card besides the context, and what a position adds."""

    name: str  # "decoding", "in the prefill phase"
    held: dict[str, int]  # bytes by what holds them, for messages
    per_token_bytes: int
    per_token_what: str = "KV cache"

    def most_tokens(self, budget_bytes: int) -> int:
        return max(0, budget_bytes - sum(self.held.values())) // self.per_token_bytes


@dataclass(frozen=True)
class ContextCost:
    """The budget a launch's context must fit, and the states it must fit in (decode, and the prefill
    phase under offload, which trades the slots and decode workspaces for its buffers and staging)."""

    budget_bytes: int
    budget_name: str  # "the 24.00 GiB VRAM budget (--vram-budget)"
    states: tuple[DeviceState, ...]
    remedy: str  # what to change when not even a small context fits
    slots_fill_budget: bool = False  # --cache-slots auto: the slots take what the context leaves

    def most_tokens(self, headroom_bytes: int = 0) -> tuple[int, DeviceState]:
        """The largest context every state holds, and the state that bounds it."""
        return min(((s.most_tokens(self.budget_bytes - headroom_bytes), s) for s in self.states), key=lambda t: t[0])


@dataclass(frozen=True)
class ContextChoice:
    n_ctx: int
    why: str
    noteworthy: bool = False  # not what was asked or what the model says: worth a line even when all is resident


def resident_cost(f: GGUFFile, cfg: ModelConfig, drafting: bool, budget_bytes: int, budget_name: str,
                  kv_type: str = DEFAULT_KV_TYPE) -> ContextCost:
    """Every tensor on the card; the test `--profile auto` makes (weights and KV cache against the budget)."""
    weights = sum(t.nbytes for t in f.tensors.values())
    state = DeviceState("every expert resident", {"weights": weights, **_recurrent_held(cfg)},
                        kv_bytes_per_token(cfg, drafting, kv_type))
    return ContextCost(budget_bytes, budget_name, (state,), "raise the VRAM budget or offload the experts (--offload)")


def offload_cost(f: GGUFFile, cfg: ModelConfig, offload: OffloadConfig, drafting: bool, budget_bytes: int,
                 budget_name: str, prefill_scratch_bytes: int = 0, kv_type: str = DEFAULT_KV_TYPE) -> ContextCost:
    """Resident weights, slots and workspaces (decode), or the prefill phase's buffers and staging, as
    ExpertOffload reserves them; `--cache-slots auto` counted at the fewest slots a decode batch needs."""
    from runner.models.weights import is_routed_expert, load_weights
    from runner.offload.host_store import ExpertSetLayout

    layout = ExpertSetLayout(load_weights(f, cfg))
    auto = offload.cache_slots == "auto"
    slots = min_slots(cfg, offload.decode_batch) if auto else int(offload.cache_slots)
    slot_bytes = sum(min(slots, layout.n_expert(i)) * layout.expert_bytes(i) for i in layout.layers)
    weights = sum(t.nbytes for t in f.tensors.values() if not is_routed_expert(t.name))
    kv = kv_bytes_per_token(cfg, drafting, kv_type)
    hidden = prompt_hidden_bytes(cfg, 1) if offload.prefill_order == "layer_major" else 0
    recurrent = _recurrent_held(cfg)
    decode = DeviceState("decoding", {"resident weights": weights, **recurrent,
                                    f"{'at least ' if auto else ''}{slots} expert slots per layer": slot_bytes,
                                    "decode workspaces": decode_workspace_bytes(cfg, offload.decode_batch)},
                         kv + attention_partials_bytes_per_position(cfg, offload.decode_batch),
                         "KV cache and decode attention partials")
    prefill = DeviceState("in the prefill phase", {
        "resident weights": weights, **recurrent, "staging": staging_bytes(layout),
        f"prefill buffers at --prefill-ubatch {offload.prefill_ubatch}":
            prefill_workspace_bytes(cfg, offload.prefill_ubatch) + prefill_scratch_bytes}, kv + hidden,
        "KV cache and layer-major hidden states" if hidden else "KV cache")
    return ContextCost(budget_bytes, budget_name, (decode, prefill),
                       "raise the VRAM budget or lower --cache-slots and --prefill-ubatch", slots_fill_budget=auto)


def _recurrent_held(cfg: ModelConfig) -> dict[str, int]:
    """A hybrid's DeltaNet state, held whatever the context (its K/V is per token, in its attention layers)."""
    n = recurrent_state_bytes(cfg)
    return {f"DeltaNet state ({DEVICE_STATE_SETS} copies)": n} if n else {}


def choose_context(asked: int | None, n_ctx_train: int, cost: ContextCost, asked_by: str = "-c") -> ContextChoice:
    """`asked` (-c, or what `asked_by` names; None: the default) checked against `cost`, or the default
    context; DeviceMemoryError (one line) when the launch cannot hold the context."""
    if asked is not None:
        n = min(asked, n_ctx_train)
        what = f"-c {asked}" if asked_by == "-c" else asked_by
        most, state = cost.most_tokens()
        if n > most:
            fix = cost.remedy
            if most and asked_by == "-c":
                fix = f"use -c {most // CTX_ALIGN * CTX_ALIGN or most} or leave -c out"
            raise DeviceMemoryError(f"{_too_big(f'a context of {n} tokens ({what})', n, most, state, cost)}; {fix}")
        if n < asked:
            return ContextChoice(n, f"{asked_by} {asked} cut to the model's context_length {n_ctx_train}",
                                 noteworthy=True)
        return ContextChoice(n, what)
    want, why = n_ctx_train, f"the model's context_length {n_ctx_train}"
    if cost.slots_fill_budget and n_ctx_train > FIT_CTX_MIN:
        want, why = FIT_CTX_MIN, (f"the model's {n_ctx_train} held at llama.cpp's --fit-ctx floor: --cache-slots auto "
                                  f"gives the rest of the budget to expert slots; -c N for more")
    most, state = cost.most_tokens(int(AUTO_HEADROOM * cost.budget_bytes))
    if want <= most:
        return ContextChoice(want, why)
    n = most // CTX_ALIGN * CTX_ALIGN
    if n == 0:
        raise DeviceMemoryError(_too_big(f"a context of {CTX_ALIGN} tokens", CTX_ALIGN, most, state, cost)
                                + f"; {cost.remedy}")
    return ContextChoice(n, f"the model's {n_ctx_train} cut to what {cost.budget_name} leaves the "
                            f"{state.per_token_what} at {_kib(state.per_token_bytes)} per token beside {_held(state)} "
                            f"({state.name})", noteworthy=True)


def _too_big(what: str, n: int, most: int, state: DeviceState, cost: ContextCost) -> str:
    left = max(0, cost.budget_bytes - sum(state.held.values()))
    return (f"{what} needs {size_text(n * state.per_token_bytes)} of {state.per_token_what} "
            f"({_kib(state.per_token_bytes)} per token) but {cost.budget_name} has {size_text(left)} left beside "
            f"{_held(state)} ({state.name}): at most {most} tokens fit")


def _held(state: DeviceState) -> str:
    return ", ".join(f"{what} {size_text(n)}" for what, n in state.held.items())


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"
