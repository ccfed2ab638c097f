"""A decode or verify batch under expert offload as one CUDA graph: the device serves the experts itself.

SegmentedDecodeGraph cuts a step at every MoE router, because the slot cache decides on the host which
experts to upload: one host round trip per MoE layer and token (47 on the 48-layer seed shape, 2.7 ms of
host time a token on the H200). Here each router is followed, inside the graph, by the device directory of
its layer (cuda/slot_directory.cu): a kernel that makes the slot cache's hits, misses and victims on the
device and writes the pair address table the expert kernels read, and a kernel that copies the misses
from pinned host memory into their slots. So the whole step, embedding to logits, is one graph launch.

The directories hold the cache's bookkeeping while these graphs run: each step first hands it to them
(ExpertOffload.hand_to_device, a no-op while they have it), and the first host-side use of the cache
after that takes it back, so eager steps, prompts and the phase transaction see exactly the state the
device left. Everything else is DecodeGraph's: warm-up, capture, replay, one graph per row count.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from runner.backends.cuda.decode_graph import DecodeGraph
from runner.backends.cuda.decode_segments import same_tail
from runner.backends.cuda.graph_pool import allocating
from runner.engine.kv_cache import KVCache
from runner.models.weights import MoEWeights
from runner.offload.provider import moe_layer_index


class DirectoryDecodeGraph(DecodeGraph):
    serves_experts = True
    # The misses' fills on a second stream (a branch of the graph) while the pairs whose experts are held run
    # their gate-up and down; the filled pairs' launches follow the join. The same bits: each pair's rows come
    # from the same kernels, only from a second launch.
    OVERLAP_FILLS = True
    # With OVERLAP_FILLS: each miss's gate and up bytes cross first and its down bytes after, so the filled pairs'
    # gate-up launch runs while the downs still cross and only their down launch waits for all of it (a miss is
    # 1.77 to 2.04 MB on seed48, 36 to 41 us of link at 49.7 GB/s; its gate and up are 55 to 67% of it). The same
    # bits: the same kernels read the same bytes; only the waits move. seed48 offloaded on an H100: 7.26 -> 7.10 ms of
    # GPU a token (docs/perf/2026-12-07h-seed48-pdl-split-ahead-h100.md).
    SPLIT_FILLS = True
    # Guesses a layer ahead: at each MoE layer the model guesses the next MoE layer's experts from this layer's
    # input (the next norm and router on it, this many deep; docs/perf/2026-12-07e-pregate-prediction-cpu.md) and
    # the next layer's directory claims slots for them on the fill stream, after this layer's own fills, so their
    # copies run while this layer and the next one's attention compute. The next layer's serve waits only for the
    # claim (the directory's walk); its pairs on prefetched experts go to the pass after its own fills, which
    # follow the prefetch's on the fill stream (2026-12-07h: 07f measured the serve waiting for the prefetch's
    # fills too, 8.09 to 8.50 ms a token against 7.99). The guess itself (the next router, a normed product as
    # long as the layer's own) runs on a stream of its own beside this layer's router and experts (2026-12-07i: at
    # depth 5 on the main stream it cost more than the 86.5 -> 90% hits it bought, 7.06 against 6.61 ms; off the
    # main stream not yet timed: docs/wip/gpu-call-48.sh). 0: off. It changes which experts the cache holds,
    # never a token.
    PREFETCH_DEPTH = 0
    # Each serve copies its layer's directory into shared memory before its PDL wait, while the router right ahead
    # still runs (cuda/slot_directory.cu's early_directory): the copy's L2 round trips leave the critical path
    # (07h: a serve at 0 misses took 10.1 us against an empty kernel's 3.0). The same choices either way; off until
    # a GPU has run it (docs/wip/gpu-call-46.sh).
    EARLY_SERVE = False

    def __init__(self, model: Any, kv: KVCache, experts: Any, rows: int = 1, pool: Any = None):
        super().__init__(model, kv, experts, rows, pool)
        self.directories = experts.device_directories()
        k = model.cfg.n_expert_used
        layers = [moe_layer_index(lw.ffn) for lw in model.weights.layers if isinstance(lw.ffn, MoEWeights)]
        least = min(experts.cache.layer_slots(i) for i in layers) if layers else rows * k
        if rows * k > least:  # the directory kernel assumes a batch's distinct experts fit the slots
            raise ValueError(f"a directory graph of {rows} rows of top-{k} needs {rows * k} slots per layer, "
                             f"the cache has {least}")
        with self.stream, allocating(self.pool):
            self.pairs = {i: self.directories.pair_buffers(rows, k) for i in layers}
        self.fill_stream = self.cp.cuda.Stream(non_blocking=True) if self.OVERLAP_FILLS else None
        self._filled: dict[int, Any] = {}  # MoE layer -> the event after its fills, this step
        self.prefetch_depth = min(self.PREFETCH_DEPTH, k)
        if self.prefetch_depth:
            with self.stream, allocating(self.pool):
                self.prefetches = {i: self.directories.prefetch_buffers(rows, self.prefetch_depth) for i in layers}
        # the guesses' own stream beside this one (a router's launch with its own last-block counter), so the guess
        # leaves the token's critical path; with the fills in order there is no fill stream to hand them to
        self.guess_stream = (self.cp.cuda.Stream(non_blocking=True)
                             if self.prefetch_depth and self.fill_stream is not None else None)
        self._staged: tuple[int, Any] | None = None  # (next MoE layer, the event after its guess) until this serve
        self._prefetched: dict[int, Any] = {}  # MoE layer -> the event after its prefetch's fills, this step

    def enqueue(self, tokens: Sequence[int] | None) -> tuple[Any, Any]:
        self.experts.hand_to_device()  # before this step's kernels are enqueued
        self._staged, self._prefetched = None, {}
        return super().enqueue(tokens)

    def expert_pointers(self, w: MoEWeights, ids: Any, tail: np.ndarray | None = None) -> tuple[Any, Any, Any]:
        """From inside the forward, at MoE layer `w`'s router: enqueue its directory and fills; the gate, up
        and down address rows the expert kernels are to read (buffers that outlive the step), with `tail`
        one shared-expert pair per row after the routed ones (remade for it in the warm-up, before capture)."""
        layer = moe_layer_index(w)
        out = self.pairs[layer]
        if not same_tail(out.tail, tail):
            assert self.graph is None and not self.stream.is_capturing(), (
                f"layer {layer}: the pair tables changed during a capture")
            with allocating(self.pool):
                out = self.pairs[layer] = self.directories.pair_buffers(self.rows, self.model.cfg.n_expert_used,
                                                                        tail)
        walked = self._prefetched.pop(layer, None)
        if walked is not None:  # the prefetch's walk wrote this layer's directory on the fill stream; its fills
            self.cp.cuda.get_current_stream().wait_event(walked)  # follow there, ahead of this serve's own
        pending = self.prefetches[layer] if walked is not None else None
        # early: the kernel right ahead is the router (or a synthetic routing's gather), which never writes the
        # directory (a prefetch's walk, which does, joins by a full edge above)
        self._filled[layer] = self.directories.serve(layer, ids, out, self.fill_stream, self.SPLIT_FILLS, pending,
                                                     early=self.EARLY_SERVE)
        if self._staged is not None:  # the next layer's guesses: their fills queue after this layer's
            nxt, guessed = self._staged
            self._staged = None
            buffers = self.prefetches[nxt]
            self._prefetched[nxt] = self.directories.prefetch(nxt, buffers.guesses, buffers, self.fill_stream,
                                                              after=guessed)
            if guessed is not None:  # the guess read this layer's input, whose memory the pool may hand to a kernel
                self.cp.cuda.get_current_stream().wait_event(guessed)  # once the layer is done: joined here
        return out.table[0], out.table[1], out.table[2]

    def stage_guesses(self, w_next: MoEWeights, guess: Callable[[Any], None]) -> None:
        """From inside the forward, before a MoE layer's router: `guess(out)` enqueues MoE layer `w_next`'s likeliest
        experts into out (device int32 [rows, prefetch_depth]), prefetched once this layer's directory has been
        served. `out` is the layer's prefetch buffers' (they outlive the step): the walk reads it on the fill stream
        after the guess's event, when the pool may have handed the guess's own temporaries to later kernels. With a
        fill stream the guess runs on the guess stream, beside this layer's router and serve (from this stream's
        point here, where its input is ready, to just after the serve, which waits for it) instead of ahead of
        them."""
        assert self.prefetch_depth and self._staged is None, "guesses staged twice before a serve, or prefetch is off"
        layer = moe_layer_index(w_next)
        out = self.prefetches[layer].guesses
        if self.guess_stream is None:
            guess(out)
            self._staged = (layer, None)
            return
        cp = self.cp
        ready, guessed = cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True)
        ready.record(cp.cuda.get_current_stream())
        self.guess_stream.wait_event(ready)
        with self.guess_stream:
            guess(out)
        guessed.record(self.guess_stream)
        self._staged = (layer, guessed)

    def fill_passes(self, w: MoEWeights) -> tuple[Any, Any, Any] | None:
        """After expert_pointers for `w`: (the pairs' flags, 1 where its expert is being filled, by this serve or a
        prefetch ahead of it; the event after which the filled experts' gate and up bytes are in their slots; the
        event after which all their bytes are), for the expert kernels' two passes; None when the fills ran in
        order."""
        filled = self._filled.get(moe_layer_index(w))
        return None if filled is None else (self.pairs[moe_layer_index(w)].fresh, *filled)
