"""Expert offload for one engine: host store, slot cache and prefill stream under the phase transaction.

`ExpertOffload` is the backend's expert provider (decode batches are served by the slot cache,
prompts by the prefill stream) and the PhaseHost the transaction drives. A prompt the cost model
judges too short for the transaction runs through the slot cache in batches small enough that
their distinct experts fit the slots; what those prompts uploaded per token is what the cost model
expects the next one to upload.
"""

from __future__ import annotations

import math
import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from phase import PhaseCostModel, PrefillPhase, PromptCost
from runner.backends.budget import GIB
from runner.backends.limits import PROMPT_FFN_GROUP_TOKENS, SMALL_BATCH_ROWS
from runner.backends.step import Step
from runner.errors import CacheError, PhaseError
from runner.models.weights import MoEWeights
from runner.offload.backend import OffloadBackend
from runner.offload.host_store import HostExpertStore
from runner.offload.prefill_stream import PREFILL_ORDERS, PrefillOrder, PrefillStream, PromptTail, split, stream_prompt
from runner.offload.provider import ExpertMatrices
from runner.offload.sizing import (
    min_slots,
    prefill_workspace_bytes,
    prompt_hidden_bytes,
    resolve_cache_slots,
    staging_bytes,
)
from runner.offload.slot_cache import CacheCounters, ExpertSlotCache
from runner.units import size_text

TransactionMode = Literal["auto", "always", "never"]
WarmFill = Literal["host", "staging"]
DecodeGraphKind = Literal["segments", "directory"]
DECODE_GRAPHS = ("segments", "directory")
PREFILL_BUFFERS = "prefill micro-batch buffers"
log = logging.getLogger(__name__)
PROMPT_HISTORY_PAIRS = 100  # token-expert pairs prompts through the cache routed before their bytes per token are used


@dataclass(frozen=True)
class OffloadConfig:
    cache_slots: int | str = "auto"  # per MoE layer
    cache_policy: str = "lru"  # "lru" or "lfu" (aging)
    prefill_order: PrefillOrder = "layer_major"
    prefill_ubatch: int = 2048  # micro-batch inside the transaction
    vram_budget_bytes: int = 24 * GIB  # the emulated card on numpy; the CUDA backend brings its own budget
    warm_restore: bool = True  # refill the slots with the experts the end of the prompt routed to
    warm_fill: WarmFill = "host"  # staging: copy them device to device from the prompt's staging (when it fits)
    transaction: TransactionMode = "auto"  # auto: the cost model decides per prompt
    phase_cost: PhaseCostModel = field(default_factory=PhaseCostModel)
    decode_batch: int = 1  # most tokens one decode / verify batch sends through the cache
    # directory: one graph a step, the device directories serve the experts (runner/backends/cuda/token_graph.py;
    # 11% faster than segments on seed48, 4 to 12% on seed8); segments: CUDA graphs cut at each router, the host
    # serves the experts between (also the fallback where directories cannot run: see Offload.decode_graph)
    decode_graph: DecodeGraphKind = "directory"

    def __post_init__(self) -> None:
        if self.prefill_order not in PREFILL_ORDERS:
            raise CacheError(f"unknown prefill order '{self.prefill_order}'; choose from {', '.join(PREFILL_ORDERS)}")
        if self.warm_fill not in ("host", "staging"):
            raise CacheError(f"warm_fill must be host or staging, got '{self.warm_fill}'")
        if self.decode_graph not in DECODE_GRAPHS:
            raise CacheError(f"decode_graph must be {' or '.join(DECODE_GRAPHS)}, got '{self.decode_graph}'")
        if self.transaction not in ("auto", "always", "never"):
            raise CacheError(f"transaction must be auto, always or never, got '{self.transaction}'")
        if self.prefill_ubatch < 1 or self.decode_batch < 1:
            raise CacheError("prefill_ubatch and decode_batch must be positive")


@dataclass
class WarmFillCounters:
    """Prompts under warm_fill="staging": those whose slots filled from staging (all or some layers' slots), and
    those that restored some or all from the host because the slots did not fit beside the prompt's buffers."""

    staged: int = 0
    fallbacks: int = 0  # some layers' slots and the prefill buffers did not fit the budget together
    partial: int = 0  # fallbacks that still filled the groups of layers that fitted from staging
    last_fallback: str | None = None


@dataclass
class GraphCounters:
    """Decode graphs around prompts: kept through each (their temporaries beside the prompt's buffers), or, when
    that would cost the longest prompt room or its feed-forward group, dropped before each prompt and captured
    again by the steps after it."""

    kept: bool = True
    why_dropped: str | None = None
    drops: int = 0  # transactions that dropped them


@dataclass
class ThroughCacheCounters:
    """Prompts that ran through the slot cache (the transaction skipped) and the cache traffic they made."""

    prompts: int = 0
    tokens: int = 0
    traffic: CacheCounters = field(default_factory=CacheCounters)

    def to_dict(self) -> dict:
        return {"prompts": self.prompts, "tokens": self.tokens, **self.traffic.to_dict()}


def offload_config(launch: Any, **overrides: Any) -> OffloadConfig:
    """The offload settings of a resolved launch (runner.launch.profiles.LaunchSettings).

    A verify batch is the pending token plus its drafts, so the cache must serve 1 + draft_depth tokens.
    """
    budget = launch.vram_budget_gib
    fields = dict(cache_slots=launch.cache_slots, prefill_ubatch=launch.prefill_ubatch,
                  decode_batch=1 + launch.draft_depth, warm_fill=launch.warm_fill)
    if budget is not None:
        fields["vram_budget_bytes"] = int(budget * GIB)
    return OffloadConfig(**{**fields, **overrides})


class ExpertOffload:
    def __init__(self, model: Any, config: OffloadConfig, n_ctx: int, backend: OffloadBackend,
                 progress: Callable[[int, int], None] | None = None):
        self.model, self.config, self.n_ctx, self.backend = model, config, n_ctx, backend
        self.cfg = model.cfg
        self.budget, self.arena = backend.budget, backend.arena
        self.store = HostExpertStore(model.weights, backend.pin_host, progress, backend.require_pinned)
        self._reserve_workspaces()
        slots = resolve_cache_slots(config.cache_slots, self.budget, self.store,
                                    least=min_slots(self.cfg, config.decode_batch))
        self.cache = ExpertSlotCache(self.store, self.arena, slots, config.cache_policy)
        self.graphs = GraphCounters()
        self.ffn_group_tokens = self._choose_graphs()
        self._check_prefill_fits()
        self.stream = PrefillStream(self.store, self.arena, self.cache)
        self.phase = PrefillPhase(self, slots, config.phase_cost)
        self.trunk_layers = [i for i in self.store.layers if i < self.cfg.n_layer]
        self._healthy, self._reason = True, None
        self._generation = 0
        self._streaming = False
        self._fill_slots = False  # this prompt fills its warm slots from staging (decided at reserve)
        self.warm_fill = WarmFillCounters()
        self.decode_step_s = 0.0  # measured by the engine (note_decode_step); 0 until the first step
        self.through_cache = ThroughCacheCounters()
        self._directories: Any = None  # made at the first directory graph
        self.step = Step(experts=self)  # forwards whose experts this offload serves (from slots or staging)

    # -- the expert provider ----------------------------------------------------------------------
    def fetch(self, w: MoEWeights, experts: Sequence[int]) -> Mapping[int, ExpertMatrices]:
        self.check_healthy()
        if self._streaming:
            return self.stream.fetch(w, experts)
        self._generation += 1  # decode state in use
        return self.cache.fetch(w, experts)

    def prompt_addresses(self, w: MoEWeights, experts: Sequence[int]) -> np.ndarray | None:
        """While a prompt streams: fetch() as device addresses, uint64 [3, n_expert] (PrefillStream's
        fetch_addresses); None otherwise (a forward through the cache takes fetch())."""
        self.check_healthy()
        return self.stream.fetch_addresses(w, experts) if self._streaming else None

    def fetch_pair_addresses(self, w: MoEWeights, ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Segmented decode's host step: fetch()'s cache traffic for the experts of ids [T, k], with out
        uint64 [3, T * k] given each pair's gate, up and down device address (no views built)."""
        self.check_healthy()
        if self._streaming:  # no decode step runs inside the transaction
            raise PhaseError("a segmented decode step ran while a prompt was streaming its experts")
        self._generation += 1
        return self.cache.fetch_pair_addresses(w, ids, out)

    @property
    def decode_graph(self) -> str:
        """Which graphs the CUDA backend builds for decode and verify steps from this provider. Directories
        need a backend that has them and a pinned host store (their fill kernel reads it over PCIe); without
        them, segments (store.pin_note says why the store is not pinned)."""
        usable = self.backend.directories is not None and self.store.pinned
        return self.config.decode_graph if usable else "segments"

    def device_directories(self) -> Any:
        if self._directories is None:
            assert self.backend.directories is not None, "this backend has no device directories"
            self._directories = self.backend.directories(self.cache)
        return self._directories

    def hand_to_device(self) -> None:
        """A directory graph's step is about to run: the slot cache's bookkeeping to the device directories."""
        self.check_healthy()
        if self._streaming:  # the transaction drops decode graphs before a prompt streams
            raise PhaseError("a directory decode step ran while a prompt was streaming its experts")
        self._generation += 1
        self.cache.hand_to_device(self.device_directories())

    def check_healthy(self) -> None:
        if not self._healthy:
            raise PhaseError(f"the engine is unhealthy and refuses work until reset: {self._reason}")

    # -- prompts ----------------------------------------------------------------------------------
    def prefill(self, tokens: Sequence[int], kv: Any, ubatch: int, cancelled: Callable[[], bool] | None = None,
                on_chunk: Callable[[int, list[int], Any], None] | None = None,
                all_logits: bool = False, tail: PromptTail | None = None) -> list[tuple[Any, Any]] | None:
        """Run `tokens` at the next positions of `kv`: (logits, hidden) per micro-batch, None if cancelled.

        `ubatch` is the server micro-batch (outside the transaction); inside it runs prefill_ubatch.
        `tail` (the NextN block's catch-up) runs inside the transaction, its layer streamed too;
        a prompt that skips the transaction leaves it undone (the first draft catches up instead).
        """
        self.check_healthy()
        mode = self.config.transaction
        if mode == "always" or (mode == "auto" and self.phase.pays(self.prompt_cost(len(tokens)))):
            warm = self.warm_experts if self.config.warm_restore else None
            if tail is not None and tail.layer not in self.store.layers:
                tail = None
            return self.phase.run(len(tokens), lambda: self._streamed(tokens, kv, cancelled, on_chunk, all_logits,
                                                                      tail), warm)
        if mode == "never":
            self.phase.counters.skipped += 1
        return self._through_cache(tokens, kv, ubatch, cancelled, on_chunk, all_logits)

    def _streamed(self, tokens, kv, cancelled, on_chunk, all_logits, tail=None):
        self._streaming = True
        try:
            return stream_prompt(self.model, self.stream, tokens, kv, self.config.prefill_order,
                                 self.config.prefill_ubatch, cancelled, on_chunk, all_logits, tail, self.step,
                                 self.ffn_group_tokens, self._fill_slots)
        finally:
            self._streaming = False

    def cache_batch(self, ubatch: int = SMALL_BATCH_ROWS, layers: Sequence[int] | None = None) -> int:
        """Tokens per forward through the cache: distinct experts must fit the slots of `layers` (at most
        slots // top-k tokens), and at most SMALL_BATCH_ROWS, what the decode workspaces are sized for."""
        # The cap also keeps these forwards (decode, verify, a prompt that skips the transaction) on
        # CUDA's GEMV expert path, which needs no prefill scratch: a 20-token batch took 170 MiB of it
        # on the 48-layer seed shape at `--cache-slots auto`, where the budget had no room left.
        slots = min(self.cache.layer_slots(i) for i in (self.store.layers if layers is None else layers))
        return max(1, min(ubatch, slots // self.cfg.n_expert_used, SMALL_BATCH_ROWS))

    def note_decode_step(self, seconds: float) -> None:
        """A decode step's wall time (the engine times each); the cost model's floor for one forward
        through the cache. A running mean over recent steps, so a slow first step fades."""
        self.decode_step_s = seconds if self.decode_step_s == 0.0 else 0.9 * self.decode_step_s + 0.1 * seconds

    def _through_cache(self, tokens, kv, ubatch, cancelled, on_chunk, all_logits):
        size = self.cache_batch(ubatch)
        out = []
        seen, before, done = self.through_cache, self.cache.total(), 0
        try:
            for n, chunk in enumerate(split(tokens, size)):
                if cancelled is not None and cancelled():
                    return None
                out.append(self.model.forward(chunk, kv, all_logits=all_logits, step=self.step))
                done += len(chunk)
                if on_chunk is not None:
                    on_chunk(n * size, chunk.tolist(), out[-1][1])
            return out
        finally:
            seen.prompts += 1
            seen.tokens += done
            seen.traffic.add(self.cache.total().since(before))

    def prompt_cost(self, n_tokens: int) -> PromptCost:
        """Expert bytes an `n_tokens` prompt moves with the transaction and without it (phase/cost.py).

        Without it, the prompt uploads per token what earlier prompts through the cache did, once they
        routed at least PROMPT_HISTORY_PAIRS token-expert pairs; before that, every pair is costed as a
        miss. Not the cache's overall hit rate: that is decode's (one token per lookup, against a working
        set the previous tokens left), while a prompt batch of slots // top-k tokens routes to many
        distinct experts at once: on the 48-layer seed shape at 150 slots, a 1k prompt costed at a 97.3%
        decode hit rate came to 25 GB (under the transaction's 60 GB) but uploaded about 108 GB
        through the cache.
        """
        set_bytes = sum(self.store.layer_bytes(i) for i in self.trunk_layers)
        crossings = 1 if self.config.prefill_order == "layer_major" else math.ceil(n_tokens / self.config.prefill_ubatch)
        one_each = sum(self.store.expert_bytes(i) for i in self.trunk_layers)
        warm = sum(self.cache.layer_slots(i) * self.store.expert_bytes(i) for i in self.trunk_layers)
        seen = self.through_cache
        if seen.tokens * self.cfg.n_expert_used >= PROMPT_HISTORY_PAIRS:
            without = n_tokens * seen.traffic.bytes_uploaded / seen.tokens
        else:
            without = n_tokens * self.cfg.n_expert_used * one_each
        refill = int(warm * self._warm_crossing_share(n_tokens)) if self.config.warm_restore else 0
        return PromptCost(n_tokens, set_bytes * crossings + refill, int(without),
                          forwards_without=math.ceil(n_tokens / self.cache_batch()), forward_s=self.decode_step_s)

    def _warm_crossing_share(self, n_tokens: int) -> float:
        """The share of an `n_tokens` prompt's warm refill that would cross PCIe: with warm_fill="host" all; with
        "staging" that of the layer groups whose slots would not fit beside its staging and buffers."""
        if self.config.warm_fill != "staging":
            return 1.0
        beside = self._prefill_room() - staging_bytes(self.store) - self._prefill_buffer_bytes(n_tokens)
        kept = self.cache.groups_bytes(self._groups_within(beside))
        return 1.0 - kept / self.cache.nbytes if self.cache.nbytes else 0.0

    def _groups_within(self, room: int) -> list[int]:
        """The cache's groups of layers whose slots fit together in `room` bytes, first ones first."""
        kept = []
        for g in range(len(self.cache.groups)):
            if self.cache.group_bytes(g) <= room:
                kept.append(g)
                room -= self.cache.group_bytes(g)
        return kept

    def warm_experts(self) -> dict[int, list[int]]:
        """Per layer the last prompt streamed (the NextN block's too, when it caught up there), the experts
        the end of the prompt routed to, most recent first, up to the slots."""
        return {i: self.stream.recent[i][: self.cache.layer_slots(i)] for i in self.store.layers if i in self.stream.recent}

    def _prefill_room(self) -> int:
        """What a prompt's buffers may take: the free budget plus what the transaction releases (the decode
        graphs' share only when it drops them)."""
        graphs = self.backend.graph_workspaces
        dropped = graphs.nbytes if graphs is not None and not self.graphs.kept else 0
        return self.budget.free_bytes + self.cache.nbytes + self.backend.workspaces.nbytes + dropped

    def _choose_graphs(self) -> int:
        """Keep the decode graphs through prompts when that costs a prompt nothing: the context's longest one
        fits beside them with the feed-forward group it would have without them; else drop them around each
        prompt (stats and the log say why). Returns that group (_fitting_ffn_group)."""
        self.graphs.kept = False
        group = self._fitting_ffn_group()
        if self.backend.graph_workspaces is None:  # a backend without graphs: nothing to keep
            return group
        self.graphs.kept = True
        need = self._prefill_buffer_bytes(self.n_ctx, group) + staging_bytes(self.store)
        room = self._prefill_room()
        if self._fitting_ffn_group() == group and need <= room:
            return group
        self.graphs.kept = False
        self.graphs.why_dropped = (
            f"decode graphs dropped around each prompt: keeping their "
            f"{self.backend.graph_workspaces.nbytes / GIB:.2f} GiB would leave a {self.n_ctx}-token prompt "
            f"{room / GIB:.2f} GiB for the {need / GIB:.2f} GiB its buffers and staging take with "
            f"{group}-token feed-forward groups")
        log.info("%s", self.graphs.why_dropped)
        return group

    def _fitting_ffn_group(self) -> int:
        """Tokens per feed-forward group of a layer-major prompt: the most (up to PROMPT_FFN_GROUP_TOKENS,
        then a quarter of it) whose buffers fit the room at this context; else one micro-batch. Only on
        backends whose prompt products are row-invariant (CUDA), where a group gives the same bits as
        its micro-batches one by one; elsewhere (numpy's BLAS) the prompt runs micro-batch by micro-batch."""
        ubatch = self.config.prefill_ubatch
        if self.config.prefill_order != "layer_major" or not getattr(self.model.ops, "row_invariant_prompts", False):
            return ubatch
        room = self._prefill_room() - staging_bytes(self.store)
        return next((group for group in (PROMPT_FFN_GROUP_TOKENS, PROMPT_FFN_GROUP_TOKENS // 4)
                     if group > ubatch and self._prefill_buffer_bytes(self.n_ctx, group) <= room), ubatch)

    def _check_prefill_fits(self) -> None:
        need = self._prefill_buffer_bytes(self.n_ctx) + staging_bytes(self.store)
        room = self._prefill_room()
        if need > room:
            raise CacheError(
                f"prefill buffers for --prefill-ubatch {self.config.prefill_ubatch} at context {self.n_ctx} need "
                f"{need / GIB:.2f} GiB (staging {staging_bytes(self.store) / GIB:.2f} GiB for two layers' experts) "
                f"but releasing the {self.cache.slots_per_layer}-slot cache and the decode workspaces leaves "
                f"{room / GIB:.2f} GiB of the {self.budget.limit_bytes / GIB:.2f} GiB budget; lower --prefill-ubatch "
                f"or the context"
            )

    def _prefill_buffer_bytes(self, n_tokens: int, group: int | None = None) -> int:
        """Activations of a micro-batch (layer-major: of a feed-forward group), the prompt's hidden states
        between layers (layer-major) and the backend's expert scratch."""
        rows, hidden = self.config.prefill_ubatch, 0
        if self.config.prefill_order == "layer_major":
            rows = max(rows, min(n_tokens, self.ffn_group_tokens if group is None else group))
            hidden = prompt_hidden_bytes(self.cfg, n_tokens)
        return prefill_workspace_bytes(self.cfg, rows) + hidden + self.backend.prefill_scratch_bytes

    # -- PhaseHost --------------------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def unhealthy_reason(self) -> str | None:
        return self._reason

    def mark_unhealthy(self, reason: str) -> None:
        self._healthy, self._reason = False, reason

    def mark_healthy(self) -> None:
        self._healthy, self._reason = True, None

    def generation(self) -> int:
        return self._generation

    def slot_count(self) -> int:
        return self.cache.held_slots

    def quiesce(self) -> None:
        self.arena.synchronize()

    def invalidate_graphs(self) -> None:
        if not self.graphs.kept:  # kept graphs replay into memory the prompt does not take (_choose_graphs)
            self.backend.graphs.invalidate()
            self.graphs.drops += 1

    def release_slots(self) -> None:
        self.cache.release()

    def release_workspaces(self) -> None:
        self.backend.workspaces.release()
        if not self.graphs.kept and self.backend.graph_workspaces is not None:
            self.backend.graph_workspaces.release()

    def reserve_prefill_buffers(self, n_tokens: int) -> None:
        self.stream.open()
        self.budget.reserve(PREFILL_BUFFERS, self._prefill_buffer_bytes(n_tokens))
        self._fill_slots = False
        if self.config.warm_fill == "staging" and self.config.warm_restore:
            self._reserve_slots_for_fill()

    def _reserve_slots_for_fill(self) -> None:
        """warm_fill="staging": the empty slots beside staging and buffers, of every layer when the budget holds
        them all, else of the groups of layers that fit; the other layers' warm experts are restored from the
        host (counted and logged, not silent)."""
        free, need = self.budget.free_bytes, self.cache.nbytes
        groups = self._groups_within(free)
        if len(groups) < len(self.cache.groups):
            kept = self.cache.groups_bytes(groups)
            layers = sum(len(self.cache.groups[g]) for g in groups)
            rest = (f"the slots of {layers} of {len(self.store.layers)} MoE layers ({size_text(kept)}) filled from "
                    f"staging, the others' restored from the host" if groups else "warm slots restored from the host")
            reason = (f"the {self.cache.slots_per_layer}-slot cache needs {size_text(need)} beside the prompt's "
                      f"staging and buffers, {size_text(free)} free: {rest}")
            self.warm_fill.fallbacks += 1
            self.warm_fill.partial += bool(groups)
            self.warm_fill.last_fallback = reason
            log.info("warm fill from staging: %s", reason)
            if not groups:
                return
        self.cache.reserve_for_fill(groups)
        self._fill_slots = True
        self.warm_fill.staged += 1

    def free_prefill_buffers(self) -> None:
        self.budget.release(PREFILL_BUFFERS)
        self.stream.close()

    def restore_workspaces(self) -> None:
        self.backend.workspaces.reserve()
        if not self.graphs.kept and self.backend.graph_workspaces is not None:
            self.backend.graph_workspaces.reserve()

    def _reserve_workspaces(self) -> None:
        """The decode workspaces and the graphs' share, whichever is not reserved now."""
        for workspaces in (self.backend.workspaces, self.backend.graph_workspaces):
            if workspaces is not None and not workspaces.reserved:
                workspaces.reserve()

    def restore_slots(self, warm: Mapping[int, Sequence[int]] | None) -> None:
        self.cache.restore(warm)
        # A hit waits for no upload, and decode (its graphs on a stream of their own) may hit a warm
        # slot at its first step: the warm uploads finish here.
        self.arena.synchronize()

    def restore_graphs(self) -> None:
        self.backend.graphs.restore()

    def recover(self) -> None:
        """Free whatever a failed phase left reserved, then slots (cold), workspaces and graphs back.
        Slots a warm fill from staging placed before the failure are dropped with the rest, and so are the
        graphs, even kept ones: the next steps capture them again."""
        self.arena.synchronize()
        self._streaming = self._fill_slots = False
        if PREFILL_BUFFERS in self.budget.held:
            self.budget.release(PREFILL_BUFFERS)
        if self.stream.is_open:
            self.stream.close()
        if self.cache.reserved:
            self.cache.release()
        self.cache.restore(None)
        self._reserve_workspaces()
        self.backend.graphs.invalidate()
        self.backend.graphs.restore()
        self._generation += 1

    def reset(self) -> None:
        """Engine.reset(): recover from a failed phase (PhaseError if impossible); nothing to do when healthy."""
        if not self._healthy:
            self.phase.reset()

    # -- counters ---------------------------------------------------------------------------------
    def stats(self) -> dict:
        set_bytes = sum(self.store.layer_bytes(i) for i in self.trunk_layers)
        b = self.budget
        return {
            "healthy": self._healthy,
            "unhealthy_reason": self._reason,
            "generation": self._generation,
            "host_store": {"bytes": self.store.expert_set_bytes, "pinned": self.store.pinned,
                           "note": self.store.pin_note},
            "decode_graph": {"kind": self.decode_graph,  # handoffs: the cache's bookkeeping given to the device
                             "handoffs": self._directories.pushes if self._directories is not None else 0},
            "cache": {"slots_per_layer": self.cache.slots_per_layer, "policy": self.cache.policy,
                      "bytes": self.cache.nbytes, "total": self.cache.total().to_dict(),
                      "per_layer": {i: c.to_dict() for i, c in self.cache.layer_counters().items()}},
            "prefill": {"order": self.config.prefill_order, "ubatch": self.config.prefill_ubatch,
                        "warm_fill": {"mode": self.config.warm_fill, **asdict(self.warm_fill)},
                        "expert_set_bytes": set_bytes, "last_prompt": self.stream.last.to_dict(set_bytes),
                        "total": self.stream.total.to_dict(set_bytes)},
            "phase": {**self.phase.stats(), "decode_step_s": self.decode_step_s},
            "graphs": {**asdict(self.graphs), "held_bytes": self.backend.graphs.held_bytes()},
            "through_cache": self.through_cache.to_dict(),
            "budget": {"limit_bytes": b.limit_bytes, "used_bytes": b.used_bytes, "peak_bytes": b.peak_bytes,
                       "held": dict(b.held)},
        }
