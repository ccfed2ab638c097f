"""The device twin of runner/offload/slot_directory.py (cuda/slot_directory.cu).

`DeviceDirectories` is every MoE layer's directory in one device buffer, the state a
directory decode graph (token_graph.py) serves its steps from: per MoE layer and step, `serve` enqueues the
directory kernel (which writes the pair address table the expert kernels read) and the fill kernel (which
copies the misses from pinned host memory into their slots); nothing waits on the host. The slot cache hands
its bookkeeping over with `push` and takes it back with `pull` (ExpertSlotCache.hand_to_device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import cupy as cp
import numpy as np

from runner.backends.cuda.kernels import load_module
from runner.errors import CacheError
from runner.offload.slot_cache import LayerGeometry
from runner.offload.slot_directory import DirectoryCounters, DirectoryState

MAX_EXPERTS = 512  # DIR_MAX_EXPERTS
MAX_PAIRS = 256  # DIR_MAX_PAIRS
HITS, PREFETCHED = 2, 5  # the kernel's scalars: clock, filled, hits, misses, evictions, prefetched
N_GEOMETRY = 6  # slot 0, expert bytes, gate, up, down offsets, host address (GEO_* in the kernel)
FILL_THREADS = 256
FILL_BLOCKS = 64  # per expert: 16k threads of 16-byte loads keep ~256 KB in flight over PCIe
WHOLE, GATE_UP, DOWN = 0, 1, 2  # directory_fill's parts of an expert: all, the bytes before the down, the down
# 16-byte words a fill thread loads before it stores them (cuda/slot_directory.cu's FILL_UNROLL): one keeps 256 KB in
# flight an expert, and a fill ran at 41 to 43 GB/s (bench_directory_cuda, 2026-12-07e) against 50.7 for
# cudaMemcpyAsync of the same bytes. The same bytes land either way. Not yet measured at 4.
FILL_UNROLL = 1
_HOST_MEMORY = 1  # cudaMemoryTypeHost


def _check_serve_args(ids: cp.ndarray, n_expert: int) -> int:
    assert ids.dtype == cp.int32 and ids.ndim == 2 and ids.flags.c_contiguous, "ids must be C-contiguous int32 [T, k]"
    assert 0 < ids.size <= MAX_PAIRS, f"{ids.size} pairs: the directory kernel takes 1..{MAX_PAIRS}"
    assert 0 < n_expert <= MAX_EXPERTS, f"{n_expert} experts: the directory kernel takes 1..{MAX_EXPERTS}"
    return ids.size


@dataclass
class PairBuffers:
    """One MoE layer's per-step outputs of a graph of `rows` rows of top-k: they outlive the graph's steps."""

    pair_slots: cp.ndarray  # int32 [rows * k]
    fills: cp.ndarray  # int32 [rows * k, 2]
    n_fills: cp.ndarray  # int32 [1]
    table: cp.ndarray  # uint64 [3, rows * k (+ rows)]: gate, up and down address of each pair (then the tail's)
    fresh: cp.ndarray  # int32 [rows * k (+ rows)]: 1 where the pair's expert is filled this step or by a pending
    # prefetch (the tail's: 0)
    tail: np.ndarray | None = None  # the shared expert's addresses, one more pair per row (CudaOps.fold_tail)

    @classmethod
    def make(cls, rows: int, k: int, tail: np.ndarray | None = None) -> "PairBuffers":
        n = rows * k
        table = cp.zeros((3, n + (rows if tail is not None else 0)), dtype=cp.uint64)
        if tail is not None:  # written once: directory_serve writes the routed pairs only
            table[:, n:] = cp.asarray(np.asarray(tail, dtype=np.uint64)[:, None])
        return cls(cp.zeros(n, dtype=cp.int32), cp.zeros((n, 2), dtype=cp.int32), cp.zeros(1, dtype=cp.int32),
                   table, cp.zeros(table.shape[1], dtype=cp.int32), tail)


@dataclass
class PrefetchBuffers:
    """One MoE layer's prefetch outputs in a graph: the fills the guesses made (they outlive the graph's steps)."""

    fills: cp.ndarray  # int32 [rows * d, 2]
    n_fills: cp.ndarray  # int32 [1]
    guesses: cp.ndarray  # int32 [rows, d]: the guesses the walk reads

    @classmethod
    def make(cls, rows: int, d: int) -> "PrefetchBuffers":
        return cls(cp.zeros((rows * d, 2), dtype=cp.int32), cp.zeros(1, dtype=cp.int32),
                   cp.zeros((rows, d), dtype=cp.int32))


def _fields(n_expert: int, n_slots: int) -> list[tuple[str, Any, int]]:
    """One layer's arrays in the shared buffer, in order: (name, dtype, count), each 8-byte aligned."""
    return [("scalars", np.int64, 6), ("geometry", np.uint64, N_GEOMETRY), ("slot_of", np.int32, n_expert),
            ("expert_of", np.int32, n_slots), ("last", np.int64, n_slots), ("count", np.float64, n_slots)]


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 8) * 8


def layer_bytes(n_expert: int, n_slots: int) -> int:
    return sum(_aligned(np.dtype(dtype).itemsize * n) for _, dtype, n in _fields(n_expert, n_slots))


class _LayerViews:
    """One layer's arrays inside the shared buffer (device or host side), as the kernel takes them."""

    scalars: Any
    geometry: Any
    slot_of: Any
    expert_of: Any
    last: Any
    count: Any

    def __init__(self, buffer: Any, at: int, n_expert: int, n_slots: int):
        for name, dtype, n in _fields(n_expert, n_slots):
            nbytes = np.dtype(dtype).itemsize * n
            setattr(self, name, buffer[at : at + nbytes].view(dtype))
            at += _aligned(nbytes)


class DeviceDirectories:
    """Every MoE layer's directory on the device, in one buffer mirrored by one pinned host buffer, so a
    handoff is one copy each way. `n_slots` and the policy are fixed; where the slots are (their geometry)
    comes with each push, so captured graphs stay valid when a prompt moves the slots."""

    def __init__(self, layers: Mapping[int, tuple[int, int]], policy: str, period_of: Mapping[int, int]):
        """layers: MoE layer -> (experts, slots); period_of: layer -> the aging LFU period (POLICIES')."""
        if policy not in ("lru", "lfu"):
            raise CacheError(f"unknown cache policy '{policy}'; choose from lru, lfu")
        for layer, (n_expert, n_slots) in layers.items():
            if not 0 < n_expert <= MAX_EXPERTS:
                raise CacheError(f"layer {layer} has {n_expert} experts; the device directory takes 1..{MAX_EXPERTS}")
            if not 0 < n_slots <= n_expert:  # the kernel holds a layer's slots in arrays of MAX_EXPERTS
                raise CacheError(f"layer {layer} has {n_slots} slots for {n_expert} experts; the device directory "
                                 f"takes 1..{n_expert}")
        self.layers, self.lfu, self.period_of = dict(layers), policy == "lfu", dict(period_of)
        nbytes, self._at = 0, {}
        for layer, (n_expert, n_slots) in self.layers.items():
            self._at[layer] = nbytes
            nbytes += layer_bytes(n_expert, n_slots)
        self.nbytes = nbytes
        self.device = cp.zeros(nbytes, dtype=cp.uint8)
        memory = cp.cuda.alloc_pinned_memory(max(nbytes, 1))
        self.host = np.frombuffer(memory, dtype=np.uint8, count=nbytes)
        self.on_device = {i: _LayerViews(self.device, self._at[i], *self.layers[i]) for i in self.layers}
        self.on_host = {i: _LayerViews(self.host, self._at[i], *self.layers[i]) for i in self.layers}
        self.pushes = self.pulls = 0
        self._peek_stream = cp.cuda.Stream(non_blocking=True)  # counts() reads without waiting for the device
        self._peek = np.frombuffer(cp.cuda.alloc_pinned_memory(max(nbytes, 1)), dtype=np.uint8, count=nbytes)
        self._peek_views = {i: _LayerViews(self._peek, self._at[i], *self.layers[i]) for i in self.layers}

    # -- the handoff (DirectoryHandoff) ------------------------------------------------------------
    def push(self, states: Mapping[int, tuple[DirectoryState, LayerGeometry]]) -> None:
        for layer, (state, geo) in states.items():
            _check_mapped(layer, geo.host)
            h = self.on_host[layer]
            h.scalars[:] = (state.clock, state.filled, 0, 0, 0, 0)
            h.geometry[:] = (geo.slot0, geo.expert_bytes, *geo.offsets, geo.host)
            h.slot_of[:], h.expert_of[:], h.last[:], h.count[:] = (state.slot_of, state.expert_of, state.last,
                                                                    state.count)
        cp.cuda.Device().synchronize()  # no kernel of an earlier step still reads the buffer
        self.device.set(self.host)
        cp.cuda.Device().synchronize()  # the graphs' streams do not order after this copy's
        self.pushes += 1

    def pull(self) -> dict[int, tuple[DirectoryState, DirectoryCounters]]:
        cp.cuda.Device().synchronize()  # every step's kernels done
        self.device.get(out=self.host)
        self.pulls += 1
        out = {}
        for layer, h in self.on_host.items():
            clock, filled, *counts = (int(v) for v in h.scalars)
            out[layer] = (DirectoryState(h.slot_of.copy(), h.expert_of.copy(), h.last.copy(), h.count.copy(),
                                         clock, filled), DirectoryCounters(*counts))
        return out

    def counts(self) -> dict[int, DirectoryCounters]:
        self.device.get(stream=self._peek_stream, out=self._peek)
        self._peek_stream.synchronize()
        return {i: DirectoryCounters(*(int(v) for v in h.scalars[HITS : PREFETCHED + 1]))
                for i, h in self._peek_views.items()}

    # -- a step ------------------------------------------------------------------------------------
    def pair_buffers(self, rows: int, k: int, tail: np.ndarray | None = None) -> PairBuffers:
        return PairBuffers.make(rows, k, tail)

    def prefetch_buffers(self, rows: int, d: int) -> PrefetchBuffers:
        return PrefetchBuffers.make(rows, d)

    def serve(self, layer: int, ids: cp.ndarray, out: PairBuffers, fill_stream: Any = None,
              split: bool = False, pending: PrefetchBuffers | None = None,
              early: bool = False) -> tuple[Any, Any] | None:
        """Enqueue on the current stream: the directory over ids [rows, k], `out.table` and `out.fresh`, then the
        misses' fills; with `fill_stream`, the fills on that stream after the directory, so the current stream
        can run the pairs whose experts are held meanwhile: the events that mark the gate and up bytes filled and
        all of them (else None). `split`: the gate and up bytes of every miss first, then the downs, so the first
        event comes before the second (else both are the one event after whole experts). `pending`: the buffers
        of a prefetch of this layer whose fills may still be crossing ahead of these on the fill stream; its
        experts' pairs count as fresh too (the pass after the fills). `early`: the kernel enqueued right before
        this one on the stream never writes this layer's directory (a decode graph's router), so the serve copies
        the directory in while that kernel still runs (PDL; cuda/slot_directory.cu's early_directory)."""
        n_expert, n_slots = self.layers[layer]
        n_pairs = _check_serve_args(ids, n_expert)
        width = n_pairs + (ids.shape[0] if out.tail is not None else 0)
        assert out.table.shape == (3, width), f"pair buffers of {out.table.shape[1]} pairs for {width}"
        d = self.on_device[layer]
        module = _module()
        module.get_function("directory_serve")(
            (1,), (32,),
            (ids, np.int32(n_pairs), np.int32(ids.shape[1]), d.slot_of, d.expert_of, d.last, d.count, d.scalars,
             np.int32(n_expert), np.int32(n_slots), np.int32(self.lfu), np.int64(self.period_of[layer]),
             out.pair_slots, out.fills, out.n_fills, d.geometry, out.table, np.int32(width), out.fresh, np.int32(0),
             *((pending.fills, pending.n_fills) if pending is not None else (np.uint64(0), np.uint64(0))),
             np.int32(early)))
        fill = module.get_function("directory_fill")
        if fill_stream is None:
            fill((FILL_BLOCKS, n_pairs), (FILL_THREADS,), (out.fills, out.n_fills, d.geometry, np.int32(WHOLE)))
            return None
        served, filled = cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True)  # a graph's fork, join
        served.record(cp.cuda.get_current_stream())
        fill_stream.wait_event(served)
        gate_up = filled
        with fill_stream:
            if split:
                fill((FILL_BLOCKS, n_pairs), (FILL_THREADS,), (out.fills, out.n_fills, d.geometry, np.int32(GATE_UP)))
                gate_up = cp.cuda.Event(disable_timing=True)
                gate_up.record(fill_stream)
            fill((FILL_BLOCKS, n_pairs), (FILL_THREADS,), (out.fills, out.n_fills, d.geometry,
                                                           np.int32(DOWN if split else WHOLE)))
        filled.record(fill_stream)
        return gate_up, filled


    def prefetch(self, layer: int, guesses: cp.ndarray, out: PrefetchBuffers, fill_stream: Any = None,
                 after: Any = None) -> Any:
        """Enqueue the layer's directory over guesses [rows, d] at a batch to come (cuda/slot_directory.cu's
        prefetch mode: slots claimed for the guesses not held, counted as prefetched) and their fills. With
        `fill_stream`, both on that stream after the current stream's work so far (which computed the guesses), or
        after the event `after` (guesses computed on another stream): the event after the directory's walk, which
        the layer's own serve must wait for (it reads the directory); the fills follow it on the fill stream, ahead
        of the serve's own, so that serve takes `out` as its `pending` and the expert kernels' pass after its fills
        covers them. Else on the current stream, and None."""
        n_expert, n_slots = self.layers[layer]
        n_pairs = _check_serve_args(guesses, n_expert)
        assert out.fills.shape[0] >= n_pairs, f"prefetch buffers of {out.fills.shape[0]} fills for {n_pairs} guesses"
        d = self.on_device[layer]
        module = _module()
        null = np.uint64(0)

        def walk() -> None:
            module.get_function("directory_serve")(
                (1,), (32,),
                (guesses, np.int32(n_pairs), np.int32(guesses.shape[1]), d.slot_of, d.expert_of, d.last, d.count,
                 d.scalars, np.int32(n_expert), np.int32(n_slots), np.int32(self.lfu), np.int64(self.period_of[layer]),
                 null, out.fills, out.n_fills, null, null, np.int32(0), null, np.int32(1), null, null, np.int32(0)))

        def fill() -> None:
            module.get_function("directory_fill")((FILL_BLOCKS, n_pairs), (FILL_THREADS,), (out.fills, out.n_fills,
                                                                                           d.geometry, np.int32(WHOLE)))

        if fill_stream is None:
            walk()
            fill()
            return None
        walked = cp.cuda.Event(disable_timing=True)
        guessed = after
        if guessed is None:
            guessed = cp.cuda.Event(disable_timing=True)
            guessed.record(cp.cuda.get_current_stream())
        fill_stream.wait_event(guessed)
        with fill_stream:
            walk()
            walked.record(fill_stream)
            fill()
        return walked


def _module() -> Any:
    return load_module("slot_directory", (f"FILL_UNROLL={FILL_UNROLL}",))


def _check_mapped(layer: int, host_address: int) -> None:
    """The fill kernel reads the host store by its host address: it must be pinned memory the device maps
    at the same address (cudaHostRegister with the mapped flag, or cudaHostAlloc, under unified addressing)."""
    attrs = cp.cuda.runtime.pointerGetAttributes(host_address)
    kind = getattr(attrs, "type", getattr(attrs, "memoryType", -1))  # CuPy's name for it changed
    if kind != _HOST_MEMORY or attrs.devicePointer != host_address:
        raise CacheError(f"layer {layer}: the host store at {host_address:#x} is not pinned memory the GPU maps at "
                         "the same address; use --decode-graph segments")


def directories_for(cache: Any) -> DeviceDirectories:
    """The device directories of a slot cache (runner/offload/slot_cache.py), sized by its layers."""
    from runner.offload.policies import POLICIES

    layers = {i: (cache.store.n_expert(i), cache.layer_slots(i)) for i in cache.store.layers}
    periods = {i: getattr(POLICIES[cache.policy](n_slots, n_expert), "period", 1)
               for i, (n_expert, n_slots) in layers.items()}
    return DeviceDirectories(layers, cache.policy, periods)
