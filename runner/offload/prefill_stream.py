"""Prefill that streams each layer's expert set through a double-buffered staging area, in two orders.

- `per_microbatch` (llama.cpp's order): for each micro-batch, every layer; each layer's expert set
  crosses to the device once per micro-batch.
- `layer_major`: for each layer, upload its set once, then every micro-batch of the prompt through
  it; the set crosses once per prompt.

A schedule lists the layer visits in order; visit k stages into buffer k % 2 while visit k-1's
buffer is still computing, and entering visit k prefetches visit k+1 into the other one. Experts
the slot cache holds are not uploaded (counted as skipped) and are served from their slots, so
the bytes that cross are exactly: expert set bytes x visits - skipped bytes.

With `fill_slots` (OffloadConfig.warm_fill="staging"), leaving a layer's last visit copies the experts
the prompt routed to last (its warm set) from that visit's buffer into the reserved, empty slot
cache, device to device, before the buffer is staged again: restore then uploads nothing for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from runner.backends.step import Step
from runner.errors import CacheError
from runner.models.weights import MoEWeights
from runner.offload.device_arena import DeviceArena, DeviceRegion
from runner.offload.host_store import HostExpertStore
from runner.offload.provider import ExpertMatrices, moe_layer_index
from runner.offload.slot_cache import ExpertSlotCache
from runner.offload.timeline import Timeline

PrefillOrder = Literal["per_microbatch", "layer_major"]
PREFILL_ORDERS = ("per_microbatch", "layer_major")


@dataclass(frozen=True)
class PromptTail:
    """Work after a streamed prompt on one more MoE layer, whose experts are staged like the prompt's."""

    layer: int
    run: Callable[[], Any]


def schedule(order: PrefillOrder, moe_layers: Sequence[int], n_chunks: int) -> list[int]:
    """The layer visits of a prompt of `n_chunks` micro-batches, in order."""
    if order == "per_microbatch":
        return [layer for _ in range(n_chunks) for layer in moe_layers]
    if order == "layer_major":
        return list(moe_layers)
    raise CacheError(f"unknown prefill order '{order}'; choose from {', '.join(PREFILL_ORDERS)}")


@dataclass
class StreamCounters:
    """Per layer: visits (crossings), bytes and experts uploaded, experts and bytes skipped as held, and the
    distinct experts the prompt routed to (what a stream of only the used experts would move, as llama.cpp's
    scheduler copies per micro-batch)."""

    visits: dict[int, int] = field(default_factory=dict)
    bytes: dict[int, int] = field(default_factory=dict)
    experts: dict[int, int] = field(default_factory=dict)
    skipped: dict[int, int] = field(default_factory=dict)
    skipped_bytes: dict[int, int] = field(default_factory=dict)
    routed: dict[int, int] = field(default_factory=dict)

    def count(self, layer: int, nbytes: int, experts: int, skipped: int, skipped_bytes: int, visits: int = 1) -> None:
        for d, v in ((self.visits, visits), (self.bytes, nbytes), (self.experts, experts), (self.skipped, skipped),
                     (self.skipped_bytes, skipped_bytes)):
            d[layer] = d.get(layer, 0) + v

    def add(self, other: "StreamCounters") -> None:
        for layer in other.visits:
            self.count(layer, other.bytes[layer], other.experts[layer], other.skipped[layer],
                       other.skipped_bytes[layer], other.visits[layer])
        for layer, n in other.routed.items():
            self.routed[layer] = self.routed.get(layer, 0) + n

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def to_dict(self, expert_set_bytes: int) -> dict:
        return {"bytes": self.total_bytes, "expert_sets": self.total_bytes / expert_set_bytes,
                "skipped_experts": sum(self.skipped.values()), "skipped_bytes": sum(self.skipped_bytes.values()),
                "routed_experts": sum(self.routed.values()),
                "per_layer": {layer: {"visits": self.visits[layer], "bytes": self.bytes[layer],
                                      "experts": self.experts[layer], "skipped": self.skipped[layer],
                                      "routed": self.routed.get(layer, 0)}
                              for layer in self.visits}}


class PrefillStream:
    """An ExpertProvider for prompts: serves the visited layer's experts from staging (or from slots)."""

    def __init__(self, store: HostExpertStore, arena: DeviceArena, cache: ExpertSlotCache | None = None):
        self.store = store
        self.arena = arena
        self.cache = cache
        self.buffers: list[DeviceRegion] = []
        self.last = StreamCounters()  # the prompt in progress, or the last one
        self.total = StreamCounters()
        self.recent: dict[int, list[int]] = {}  # per layer, experts most recently routed first
        self.timeline: Timeline | None = None  # when set, copy and compute spans are recorded into it
        self._computing: int | None = None  # the open compute span
        self._plan: list[int] = []
        self._next = 0  # the visit enter() starts next
        self._staged: list[tuple[int, set[int], Any]] = []  # per buffer: (visit, skipped experts, fence)
        self._last_visit: dict[int, int] = {}  # layer -> its last visit, when this prompt fills slots

    # -- memory -----------------------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        return bool(self.buffers)

    def open(self) -> None:
        """Reserve the two layer-sized staging buffers."""
        nbytes = self.store.max_layer_bytes
        self.buffers = [self.arena.reserve(f"prefill staging {name}", nbytes) for name in "AB"]

    def close(self) -> None:
        for region in self.buffers:
            self.arena.free(region)
        self.buffers = []

    # -- one prompt -------------------------------------------------------------------------------
    def begin(self, visits: Sequence[int], fill_slots: bool = False) -> None:
        if not self.is_open:
            raise CacheError("prefill staging is not reserved")
        if fill_slots and (self.cache is None or not self.cache.reserved):
            raise CacheError("a warm fill from staging needs the slot cache reserved during the prompt")
        self._plan = list(visits)
        # Layers whose slots are reserved (reserve_for_fill may keep only some groups) fill after their last visit.
        self._last_visit = ({layer: k for k, layer in enumerate(self._plan) if self.cache.has_slots(layer)}  # type: ignore[union-attr]
                            if fill_slots else {})
        self._next = 0
        self._staged = [(-1, set(), None), (-1, set(), None)]
        self.last = StreamCounters()
        self.recent = {}
        if self._plan:
            self._stage(0)  # the first MoE layer's set crosses under the embedding and the dense layers

    def end(self) -> None:
        self.last.routed = {layer: len(routed) for layer, routed in self.recent.items()}
        self.total.add(self.last)
        self._plan, self._last_visit = [], {}

    def enter(self, layer: int) -> None:
        """Called before each layer runs: switch to its visit's buffer and prefetch the next visit."""
        if layer in self.store.layers:  # dense layers stream nothing
            self._enter_visit(layer)
        if self.timeline is not None:
            label = f"visit {self._next - 1}" if layer in self.store.layers else "dense"
            self._computing = self.timeline.start("compute", layer, label)

    def leave(self, layer: int) -> None:
        """Called after each layer's work is enqueued: fills its slots from staging after its last visit
        (the warm fill), closes its compute span."""
        k = self._next - 1
        if self._last_visit.get(layer) == k and layer in self.recent:
            self._fill_slots(layer, k)
        if self.timeline is not None and self._computing is not None:
            self.timeline.stop(self._computing)
            self._computing = None

    def _enter_visit(self, layer: int) -> None:
        k = self._next
        if k >= len(self._plan) or self._plan[k] != layer:
            expected = self._plan[k] if k < len(self._plan) else "none"
            raise CacheError(f"prefill stream out of step: visit {k} should be layer {expected}, got layer {layer}")
        if self._staged[k % 2][0] != k:
            self._stage(k)
        if k + 1 < len(self._plan):
            self._stage(k + 1)  # overlaps this visit's compute on the CUDA copy stream
        self._next = k + 1

    def _fill_slots(self, layer: int, k: int) -> None:
        """Copy the layer's warm set (Offload.warm_experts' list for it) from visit k's buffer into its slots.
        Runs before entering visit k + 1, which stages visit k + 2 into this buffer once the compute enqueued
        before it, this copy included, is done."""
        visit, skipped, fence = self._staged[k % 2]
        assert visit == k and self.cache is not None
        if skipped:  # served from slots, not staged: none held, since a layer's slots fill after its last visit
            raise CacheError(f"layer {layer}: experts {sorted(skipped)} were held before its warm fill")
        self.arena.wait(fence)  # the copy runs on the compute stream, after the buffer's upload
        self.cache.fill_from_staging(layer, self.recent[layer], self.buffers[k % 2])

    def fetch(self, w: MoEWeights, experts: Sequence[int]) -> Mapping[int, ExpertMatrices]:
        layer, k, region, skipped = self._visit_of(w, experts)
        layout, eb = self.store.layout(layer), self.store.expert_bytes(layer)
        return {e: self.cache.peek(layer, e) if e in skipped else self.arena.view(region, e * eb, layout)  # type: ignore[union-attr]
                for e in (int(e) for e in experts)}

    def fetch_addresses(self, w: MoEWeights, experts: Sequence[int]) -> np.ndarray:
        """fetch() as device addresses only: uint64 [3, n_expert], each expert's gate, up and down (0 for
        the experts not asked for). The CUDA prompt kernels need nothing else, and building views of a
        layer's 512 experts cost milliseconds per layer, with the GPU idle meanwhile."""
        layer, k, region, skipped = self._visit_of(w, experts)
        layout, eb = self.store.layout(layer), self.store.expert_bytes(layer)
        wanted = np.asarray(experts, dtype=np.int64)
        out = np.zeros((3, self.store.n_expert(layer)), dtype=np.uint64)
        base = np.uint64(self.arena.address(region, 0)) + wanted.astype(np.uint64) * np.uint64(eb)
        for row, m in enumerate((layout.gate, layout.up, layout.down)):
            out[row, wanted] = base + np.uint64(m.offset)
        for e in skipped.intersection(wanted.tolist()):
            held = self.cache.peek(layer, e)  # type: ignore[union-attr]
            out[:, e] = [_pointer(held.gate), _pointer(held.up), _pointer(held.down)]
        return out

    def _visit_of(self, w: MoEWeights, experts: Sequence[int]) -> tuple[int, int, DeviceRegion, set[int]]:
        """The layer, visit, buffer and cache-held experts that serve `experts` now; notes their recency
        and orders compute after the visit's uploads."""
        layer = moe_layer_index(w)
        k = self._next - 1
        if k < 0 or self._plan[k] != layer:
            raise CacheError(f"layer {layer} asked for experts outside its prefill visit")
        visit, skipped, fence = self._staged[k % 2]
        assert visit == k
        assert self.cache is not None or not skipped
        waiting = self.timeline.start("wait", layer, f"visit {k}") if self.timeline is not None else None
        self.arena.wait(fence)
        if waiting is not None:
            self.timeline.stop(waiting)  # type: ignore[union-attr]
        self.recent[layer] = list(dict.fromkeys([*(int(e) for e in experts), *self.recent.get(layer, [])]))
        return layer, k, self.buffers[k % 2], skipped

    def _stage(self, k: int) -> None:
        """Upload visit k's layer into buffer k % 2, one copy per run of experts the cache does not hold."""
        layer, region = self._plan[k], self.buffers[k % 2]
        n, eb = self.store.n_expert(layer), self.store.expert_bytes(layer)
        held = set(self.cache.held(layer)) if self.cache is not None and self.cache.reserved else set()
        keep = np.array([e not in held for e in range(n)])
        span = self.timeline.start("copy", layer, f"visit {k}") if self.timeline is not None else None
        run_start = None
        for e in range(n + 1):
            if e < n and keep[e]:
                run_start = e if run_start is None else run_start
            elif run_start is not None:
                self.arena.upload(region, run_start * eb, self.store.experts(layer, run_start, e - run_start))
                run_start = None
        if span is not None:
            self.timeline.stop(span)  # type: ignore[union-attr]
        uploaded = int(keep.sum())
        self.last.count(layer, uploaded * eb, uploaded, n - uploaded, (n - uploaded) * eb)
        self._staged[k % 2] = (k, held, self.arena.fence())


def _pointer(view: Any) -> int:
    """A device view's address (CuPy), or an emulated one's (numpy)."""
    return int(view.data.ptr) if hasattr(view.data, "ptr") else int(view.ctypes.data)


def split(tokens: Sequence[int], ubatch: int) -> list[np.ndarray]:
    return [np.asarray(tokens[s : s + ubatch]) for s in range(0, len(tokens), ubatch)]


def stream_prompt(model: Any, stream: PrefillStream, tokens: Sequence[int], kv: Any, order: PrefillOrder,
                  ubatch: int, cancelled: Callable[[], bool] | None = None,
                  on_chunk: Callable[[int, list[int], Any], None] | None = None,
                  all_logits: bool = False, tail: PromptTail | None = None,
                  step: Step | None = None, group_tokens: int = 0,
                  fill_slots: bool = False) -> list[tuple[Any, Any]] | None:
    """Run `tokens` through `model` at the next positions of `kv`, experts streamed in `order`.

    Returns (logits, hidden) per micro-batch (logits of its last row, or all rows with
    `all_logits`), or None when `cancelled` said yes: between micro-batches per_microbatch keeps the
    chunks done; between layers layer_major keeps nothing of this prompt. `on_chunk(offset, chunk,
    hidden)` hears each micro-batch once its K/V are in the cache. `tail` runs after the prompt in
    one more visit, of its layer (the NextN block catching up over the prompt's states). `step`
    names the provider the forwards fetch experts from (default: `stream` itself); layer_major runs
    each layer's feed-forward half over groups of up to `group_tokens` prompt tokens (0: per micro-batch).
    `fill_slots` fills each layer's (and the tail's) warm slots from staging after its last visit.
    """
    step = step or Step(experts=stream)
    chunks = split(tokens, ubatch)
    offsets = [i * ubatch for i in range(len(chunks))]
    moe_layers = [i for i in stream.store.layers if i < model.cfg.n_layer]
    stream.begin(schedule(order, moe_layers, len(chunks)) + ([tail.layer] if tail is not None else []), fill_slots)
    try:
        if order == "per_microbatch":
            out: list[tuple[Any, Any]] | None = []
            for offset, chunk in zip(offsets, chunks):
                if cancelled is not None and cancelled():
                    return None
                out.append(model.forward(chunk, kv, all_logits=all_logits, before_layer=stream.enter,
                                         after_layer=stream.leave, step=step))
                if on_chunk is not None:
                    on_chunk(offset, chunk.tolist(), out[-1][1])
        else:
            out = model.forward_layer_major(chunks, kv, all_logits=all_logits, before_layer=stream.enter,
                                            cancelled=cancelled, after_layer=stream.leave, step=step,
                                            group_tokens=group_tokens)
            if out is not None and on_chunk is not None:
                for offset, chunk, (_, hidden) in zip(offsets, chunks, out):
                    on_chunk(offset, chunk.tolist(), hidden)
        if out is not None and tail is not None:
            stream.enter(tail.layer)
            tail.run()
            stream.leave(tail.layer)
        return out
    finally:
        stream.end()
