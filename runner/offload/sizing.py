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
from runner.backends.kv_type import DEFAULT_KV_TYPE, kv_value_bytes
from runner.backends.limits import DECODE_KV_CHUNK, DELTA_RULE_CHUNK, SMALL_BATCH_ROWS
from runner.engine.hybrid_cache import DEVICE_STATE_SETS
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


def attention_layers(cfg: ModelConfig) -> int:
    """Trunk layers that keep K/V: all of them, or a hybrid's gated-attention layers (its DeltaNet layers
    keep a state of fixed size instead)."""
    return sum(not cfg.is_recurrent(i) for i in range(cfg.n_layer))


def delta_net_state_bytes(cfg: ModelConfig) -> int:
    """One copy of every DeltaNet layer's state: the short conv's last K-1 inputs and the recurrent state."""
    dn = cfg.delta_net
    if dn is None:
        return 0
    per_layer = (dn.conv_kernel - 1) * dn.conv_dim + dn.n_v_heads * dn.head_dim * dn.head_dim
    return sum(cfg.is_recurrent(i) for i in range(cfg.n_layer)) * per_layer * F32


def recurrent_state_bytes(cfg: ModelConfig) -> int:
    """The DeltaNet state a hybrid's sequence cache keeps on the device whatever the context: at most
    DEVICE_STATE_SETS copies (hybrid_cache.py: the live state, its checkpoints, a verify batch's rows)."""
    return DEVICE_STATE_SETS * delta_net_state_bytes(cfg)


def kv_cache_bytes(cfg: ModelConfig, n_ctx: int, kv_type: str = DEFAULT_KV_TYPE) -> int:
    """The trunk's sequence cache on the device: K/V (as `kv_type`) of its attention layers for n_ctx
    positions, and a hybrid's float32 DeltaNet state (recurrent_state_bytes)."""
    kv = 2 * attention_layers(cfg) * n_ctx * cfg.n_head_kv * cfg.head_dim * kv_value_bytes(kv_type)
    return kv + recurrent_state_bytes(cfg)


def kv_bytes_per_token(cfg: ModelConfig, drafting: bool, kv_type: str = DEFAULT_KV_TYPE) -> int:
    """One position of K and V (as `kv_type`) in every trunk attention layer, and in the NextN block's own
    cache when it drafts (a hybrid's NextN block is gated attention)."""
    layers = attention_layers(cfg) + (min(cfg.n_nextn, 1) if drafting else 0)  # the drafter runs the first block
    return 2 * layers * cfg.n_head_kv * cfg.head_dim * kv_value_bytes(kv_type)


def _mixer_floats_per_token(cfg: ModelConfig) -> int:
    """A token's activations in the token-mixing half of a layer: q/k/v and the attention output; a
    hybrid's wider of gated attention (q and its gate) and Gated DeltaNet (the conv's input, window and
    output, q/k/v per value head, the output and its gate, beta and g)."""
    q_dim = cfg.n_head * cfg.head_dim
    dn = cfg.delta_net
    if dn is None:
        return 3 * q_dim
    attention = 4 * q_dim + 2 * cfg.n_head_kv * cfg.head_dim
    return max(attention, 3 * dn.conv_dim + 5 * dn.value_dim + 2 * dn.n_v_heads)


def graph_rows(decode_batch: int = 1) -> int:
    """Rows of activations the CUDA graphs keep, each its own: one for decode and one per MTP verify batch size
    up to `decode_batch` (1 + 2 + ... + decode_batch rows); with MTP the NextN block's draft steps as many again."""
    graphs = decode_batch * (decode_batch + 1) // 2
    return graphs if decode_batch == 1 else 2 * graphs


def decode_rows(decode_batch: int = 1) -> int:
    """Rows of decode activations the card holds at once: the graphs' (graph_rows), and an eager batch may
    reach SMALL_BATCH_ROWS."""
    return max(SMALL_BATCH_ROWS, graph_rows(decode_batch))


def _decode_floats_per_row(cfg: ModelConfig) -> int:
    return 6 * cfg.n_embd + _mixer_floats_per_token(cfg) + 2 * cfg.n_expert_used * cfg.n_ff_exp + cfg.n_vocab


def decode_workspace_bytes(cfg: ModelConfig, decode_batch: int = 1) -> int:
    """Activations of the decode and verify batches: hidden, q/k/v, expert intermediates, logits."""
    return decode_rows(decode_batch) * _decode_floats_per_row(cfg) * F32


def _partials_bytes_per_position(cfg: ModelConfig, rows: int) -> int:
    return -(-rows * cfg.n_head * (cfg.head_dim + 2) * F32 // DECODE_KV_CHUNK)


def attention_partials_bytes_per_position(cfg: ModelConfig, decode_batch: int = 1) -> int:
    """Split-KV attention's partial outputs (n_head x (head_dim + 2) floats per row and split of
    DECODE_KV_CHUNK keys), per position of the context: a decode graph's attention spans the whole cache
    buffer, so its partials grow with n_ctx (GLM-4.5-Air-like, 96 heads, at 128k: 51 MB a graph row)."""
    return _partials_bytes_per_position(cfg, decode_rows(decode_batch))


def decode_reservation_bytes(cfg: ModelConfig, n_ctx: int, decode_batch: int = 1) -> int:
    """What the ledger keeps for decoding besides weights, slots and K/V: workspaces and attention partials
    (the decode graphs' share, decode_graph_bytes, and the rest for eager batches)."""
    return decode_workspace_bytes(cfg, decode_batch) + n_ctx * attention_partials_bytes_per_position(cfg, decode_batch)


def decode_graph_bytes(cfg: ModelConfig, n_ctx: int, decode_batch: int = 1) -> int:
    """The decode graphs' share of decode_reservation_bytes: their graph_rows of activations and partials.
    On CUDA these are the temporaries the graphs captured (their own pool), which a prompt may not reuse
    while the graphs are kept; the rest (eager batches' room) a prompt may take."""
    rows = graph_rows(decode_batch)
    return rows * _decode_floats_per_row(cfg) * F32 + n_ctx * _partials_bytes_per_position(cfg, rows)


def prefill_workspace_bytes(cfg: ModelConfig, ubatch: int) -> int:
    """Activations of one prefill micro-batch (flash-style attention: no [T, S] score matrix kept), and a
    hybrid's chunked delta rule scratch."""
    per_token = 6 * cfg.n_embd + _mixer_floats_per_token(cfg) + 2 * cfg.n_expert_used * cfg.n_ff_exp + cfg.n_expert
    return (ubatch * per_token + _delta_rule_scratch_floats(cfg, ubatch)) * F32 + cfg.n_vocab * F32


def _delta_rule_scratch_floats(cfg: ModelConfig, ubatch: int) -> int:
    """The chunked delta rule's scratch for a micro-batch (CUDA prompts): U and W [H_v, T, S], P [H_v, T, 64]
    and G [H_v, T], T padded to whole chunks."""
    dn = cfg.delta_net
    if dn is None:
        return 0
    padded = -(-ubatch // DELTA_RULE_CHUNK) * DELTA_RULE_CHUNK
    return padded * (2 * dn.value_dim + (DELTA_RULE_CHUNK + 1) * dn.n_v_heads)


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
