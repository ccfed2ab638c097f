"""How many bytes the offload pieces need, and how many cache slots per layer the budget leaves.

The workspace figures (decode and prefill activations, layer-major hidden states) are estimates, and
both backends reserve them by name: on CUDA those tensors come from CuPy's pool, which is capped at
the budget less the arena's regions, so a reservation keeps room for them in the ledger rather than
standing for one allocation. On CUDA, weights, the KV cache, slots and staging buffers are reserved
at the sizes actually allocated.
"""

from __future__ import annotations

from typing import Literal, Union

from runner.backends.budget import GIB, DeviceBudget
from runner.backends.limits import SMALL_BATCH_ROWS
from runner.errors import CacheError
from runner.models.config import ModelConfig
from runner.offload.host_store import ExpertSetLayout

SlotRequest = Union[int, Literal["auto"]]
F32 = 4
# `--cache-slots auto` leaves this fraction of the budget free for device memory the ledger does not
# itemize (CuPy's pool rounding, cuBLAS workspace, small cached index arrays).
AUTO_HEADROOM = 0.02


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"  # one slot: a hundredth of a GiB would read as 0.01


def parse_cache_slots(text: str | int) -> SlotRequest:
    """`--cache-slots N|auto`."""
    if isinstance(text, int) or str(text).strip().isdigit():
        n = int(text)
        if n < 1:
            raise CacheError(f"--cache-slots must be a positive number of slots per layer or 'auto', got {text}")
        return n
    if str(text).strip().lower() == "auto":
        return "auto"
    raise CacheError(f"--cache-slots must be a positive number of slots per layer or 'auto', got '{text}'")


def kv_cache_bytes(cfg: ModelConfig, n_ctx: int) -> int:
    return 2 * cfg.n_layer * n_ctx * cfg.n_head_kv * cfg.head_dim * F32


def kv_bytes_per_token(cfg: ModelConfig, drafting: bool) -> int:
    """One position of K and V in every trunk layer, and in the NextN block's own cache when it drafts."""
    layers = cfg.n_layer + (min(cfg.n_nextn, 1) if drafting else 0)  # the drafter runs the first NextN block
    return 2 * layers * cfg.n_head_kv * cfg.head_dim * F32


def decode_workspace_bytes(cfg: ModelConfig, batch: int = SMALL_BATCH_ROWS) -> int:
    """Activations of a decode / verify batch: hidden, q/k/v, expert intermediates, logits."""
    per_token = 6 * cfg.n_embd + 3 * cfg.n_head * cfg.head_dim + 2 * cfg.n_expert_used * cfg.n_ff_exp + cfg.n_vocab
    return batch * per_token * F32


def prefill_workspace_bytes(cfg: ModelConfig, ubatch: int) -> int:
    """Activations of one prefill micro-batch (flash-style attention: no [T, S] score matrix kept)."""
    per_token = 6 * cfg.n_embd + 3 * cfg.n_head * cfg.head_dim + 2 * cfg.n_expert_used * cfg.n_ff_exp + cfg.n_expert
    return ubatch * per_token * F32 + cfg.n_vocab * F32


def prompt_hidden_bytes(cfg: ModelConfig, n_tokens: int) -> int:
    """Layer-major prefill keeps every chunk's hidden state between layers (in and out)."""
    return 2 * n_tokens * cfg.n_embd * F32


def staging_bytes(store: ExpertSetLayout) -> int:
    """Two layer-sized buffers: layer L+1 uploads while layer L computes."""
    return 2 * store.max_layer_bytes


def slot_bytes_all_layers(store: ExpertSetLayout) -> int:
    """One slot in every MoE layer."""
    return sum(store.expert_bytes(i) for i in store.layers)


def min_slots(cfg: ModelConfig, decode_batch: int) -> int:
    """A decode / verify batch of `decode_batch` tokens may route to this many distinct experts per layer."""
    return min(cfg.n_expert, decode_batch * cfg.n_expert_used)


def resolve_cache_slots(request: SlotRequest, budget: DeviceBudget, store: ExpertSetLayout, least: int) -> int:
    """Slots per layer for `request` in what `budget` has free now (after resident weights, KV, workspaces)."""
    per_slot = slot_bytes_all_layers(store)
    free = budget.free_bytes
    fit = free // per_slot
    headroom = int(AUTO_HEADROOM * budget.limit_bytes)
    most_useful = max(store.n_expert(i) for i in store.layers)
    held = ", ".join(f"{name} {_gib(n)}" for name, n in budget.held.items()) or "nothing"
    if request == "auto":
        auto_fit = max(0, free - headroom) // per_slot
        n = min(auto_fit, most_useful)
        if n < least:
            raise CacheError(
                f"--cache-slots auto: the {_gib(free)} the {_gib(budget.limit_bytes)} VRAM budget leaves (held: {held}), "
                f"less {_gib(headroom)} kept free, holds {auto_fit} slots per layer of {_mib(per_slot)} each "
                f"({len(store.layers)} MoE layers), "
                f"but a decode batch needs {least}; raise the budget or lower the context"
            )
        return n
    n = int(request)
    if n < least:
        raise CacheError(f"--cache-slots {n} is fewer than the {least} distinct experts a decode batch may need per layer")
    need = sum(min(n, store.n_expert(i)) * store.expert_bytes(i) for i in store.layers)
    if need > free:
        raise CacheError(
            f"--cache-slots {n} needs {_gib(need)} ({n} slots x {len(store.layers)} MoE layers, {_mib(per_slot)} "
            f"per slot in every layer) but the {_gib(budget.limit_bytes)} VRAM budget has {_gib(free)} free "
            f"(held: {held}): at most {fit} slots per layer fit; use --cache-slots {fit} or auto"
        )
    return n
