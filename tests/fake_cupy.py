"""A stand-in for CuPy in the CPU tests of the decode graph classes, and a toy model to run through them.

The stand-in runs "kernels" (Python closures) at once on a stream that is not capturing and records
them on one that is; launching a recorded graph runs them again. That is enough to check the
sequencing of warm-up, capture and replay (tests/test_decode_segments.py, tests/test_token_graph.py).
"""

from __future__ import annotations

import contextlib
import ctypes
from types import SimpleNamespace

import numpy as np

from runner.backends.step import Step
from runner.engine.kv_cache import KVCache
from runner.models.weights import MoEWeights
from runner.errors import CacheError
from runner.offload.provider import MATRICES, experts_by_recency, moe_layer_index

N_EXPERT, K = 8, 2
LAYERS = ("dense", "moe", "dense", "moe", "moe")


class DeviceArray(np.ndarray):
    def set(self, host: np.ndarray, stream: "FakeStream") -> None:
        assert not stream.capturing, "an upload inside a capture would be frozen into the graph"
        np.copyto(self, host)

    @property
    def data(self) -> SimpleNamespace:  # type: ignore[override]
        return SimpleNamespace(ptr=self.ctypes.data)


class FakeGraph:
    def __init__(self, kernels: list):
        self.kernels = kernels

    def launch(self, stream: "FakeStream") -> None:
        assert not stream.capturing
        for kernel in self.kernels:
            kernel()


class FakeStream:
    def __init__(self, device: "FakeCupy"):
        self.device, self.recording = device, None
        self.ptr = id(self)

    def __enter__(self) -> "FakeStream":
        self.device.streams.append(self)
        return self

    def __exit__(self, *exc) -> None:
        self.device.streams.pop()

    @property
    def capturing(self) -> bool:
        return self.recording is not None

    def begin_capture(self) -> None:
        assert self.recording is None, "a capture is already open"
        self.recording = []

    def end_capture(self) -> FakeGraph:
        assert self.recording is not None, "no capture is open"
        kernels = self.recording
        for stream in self.device.streams_made:  # this one, and every stream its events drew into the capture
            if stream.recording is kernels:
                stream.recording = None
        return FakeGraph(kernels)

    def synchronize(self) -> None:
        assert not self.capturing

    def wait_event(self, event) -> None:
        """Everything here runs in one order already: only that the event was made by a step before it. A wait on
        an event recorded inside a capture draws this stream into it, as stream capture does."""
        assert event.recorded, "a wait on an event never recorded"
        capture = getattr(event, "capture", None)
        if capture is not None and self.recording is None:
            self.recording = capture

    def run(self, kernel) -> None:
        if self.recording is not None:
            self.recording.append(kernel)
        else:
            kernel()


class FakeEvent:
    def __init__(self, disable_timing: bool = False):
        self.recorded, self.capture = False, None

    def record(self, stream: FakeStream) -> None:
        self.recorded, self.capture = True, stream.recording


class FakePool:
    """cupy.cuda.MemoryPool as GraphPool uses it: the bytes it served, and the streams whose free blocks it gave back."""

    def __init__(self):
        self.limit, self.served, self.released = None, 0, []

    def set_limit(self, size: int) -> None:
        self.limit = size

    def malloc(self, nbytes: int) -> None:
        self.served += nbytes

    def free_all_blocks(self, stream=None) -> None:
        self.released.append(stream)

    def total_bytes(self) -> int:
        return self.served


class FakeCupy:
    """What decode_segments and graph_pool take from CuPy: streams, zeroed device arrays, pinned host memory,
    memory pools and the allocator in effect (each device array made is recorded with it and its stream)."""

    int32, int64, uint64 = np.int32, np.int64, np.uint64

    def __init__(self):
        self.null = FakeStream(self)
        self.streams = [self.null]
        self.streams_made = [self.null]
        self.allocator = None  # None: the default pool
        self.allocations: list[tuple] = []  # (allocator, stream) of each device array made
        self.cuda = SimpleNamespace(Stream=self.stream, Event=FakeEvent, alloc_pinned_memory=bytearray, MemoryPool=FakePool,
                                    using_allocator=self.using_allocator, get_current_stream=lambda: self.current,
                                    runtime=SimpleNamespace(memcpyAsync=self.memcpy))

    @contextlib.contextmanager
    def using_allocator(self, malloc):
        before, self.allocator = self.allocator, malloc
        try:
            yield
        finally:
            self.allocator = before

    def memcpy(self, dst: int, src: int, nbytes: int, kind: int, stream_ptr: int) -> None:
        """cudaMemcpyAsync on a drained stream; never inside a capture, which would freeze it into the graph."""
        stream = next(s for s in self.streams_made if s.ptr == stream_ptr)
        assert not stream.capturing, "a host copy inside a capture"
        ctypes.memmove(dst, src, nbytes)

    def stream(self, non_blocking: bool = False) -> FakeStream:
        self.streams_made.append(FakeStream(self))
        return self.streams_made[-1]

    @property
    def current(self) -> FakeStream:
        return self.streams[-1]

    def zeros(self, shape, dtype) -> DeviceArray:
        array = np.zeros(shape, dtype=dtype).view(DeviceArray)
        self.allocations.append((self.allocator, self.current))
        if self.allocator is not None:
            self.allocator(array.nbytes)
        return array


def address(value: int) -> SimpleNamespace:
    return SimpleNamespace(data=SimpleNamespace(ptr=value))


class SlotProvider:
    """An LRU of n_slots per layer whose addresses depend on history (the slot an expert was loaded into)."""

    def __init__(self, device: FakeCupy, fail_at: int | None = None, n_slots: int = 3):
        self.device, self.fail_at, self.n_slots = device, fail_at, n_slots
        self.slot_of: dict[int, dict[int, int]] = {}  # layer -> expert -> slot, least recent first
        self.region = 0  # where the slots are: moved by relocate()
        self.calls: list[tuple[int, list[int]]] = []
        self.streams: list[FakeStream] = []

    def fetch(self, w: MoEWeights, experts: list[int]) -> dict:
        assert not self.device.current.capturing, "fetch inside a capture"
        if len(self.calls) == self.fail_at:
            self.fail_at = None
            raise CacheError("injected")
        layer = moe_layer_index(w)
        self.calls.append((layer, list(experts)))
        self.streams.append(self.device.current)
        held = self.slot_of.setdefault(layer, {})
        for e in reversed(experts):
            if e in held:
                held[e] = held.pop(e)
                continue
            free = set(range(self.n_slots)) - set(held.values())
            if not free:
                old = next(x for x in held if x not in experts)
                free = {held.pop(old)}
            held[e] = min(free)
        base = {e: 100_000 * self.region + 1000 * layer + 10 * held[e] for e in experts}
        return {e: SimpleNamespace(gate=address(b), up=address(b + 1), down=address(b + 2)) for e, b in base.items()}

    def relocate(self) -> None:
        """What a prompt's transaction does to the slots: released, then reserved again elsewhere, cold."""
        self.slot_of, self.region = {}, self.region + 1

    def fetch_pair_addresses(self, w: MoEWeights, ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        got = self.fetch(w, experts_by_recency(ids))
        for p, e in enumerate(np.asarray(ids).reshape(-1).tolist()):
            out[:, p] = [getattr(got[e], m).data.ptr for m in MATRICES]
        return out


def _moe(layer: int) -> MoEWeights:
    return MoEWeights(None, None, SimpleNamespace(name=f"blk.{layer}.ffn_gate_exps.weight"), None, None, None)


def toy_input(device: FakeCupy, step: Step, tokens: np.ndarray, kv: KVCache, extra=None) -> tuple[Step, "DeviceArray"]:
    """A toy forward's first 'kernel': x per row from its token and position (a graph's device buffers, else the
    host's), plus `extra()` read when the kernel runs; the capacity check first, as every forward makes it."""
    n = len(tokens)
    kv.positions(n)
    g = step.graph
    token = g.token if g is not None else np.asarray(tokens)
    position = g.position if g is not None else np.arange(kv.n_tokens, kv.n_tokens + n)
    x = device.zeros(n, np.int64)
    device.current.run(lambda: np.copyto(x, np.asarray(token, np.int64) * 7 + np.asarray(position, np.int64)
                                         + (extra() if extra is not None else 0)))
    return step, x


class ToyModel:
    """Per row, x from the token and position; a dense layer mixes x; an MoE layer routes on x and adds
    the gate addresses of the row's experts (what the tables say when the kernel runs)."""

    def __init__(self, device: FakeCupy, experts: SlotProvider, tails: dict[int, np.ndarray] | None = None):
        self.device = device
        self.cfg = SimpleNamespace(n_expert_used=K)
        self.weights = SimpleNamespace(layers=[SimpleNamespace(ffn=_moe(i) if kind == "moe" else None)
                                               for i, kind in enumerate(LAYERS)])
        self.experts = experts  # the provider its eager forwards fetch from
        # MoE layer -> a shared expert's (gate, up, down) addresses, folded in as one more pair per row (CudaOps)
        self.tails = tails or {}
        self.guesses_run, self.guess_streams = 0, []  # guess kernels run; the streams they were enqueued on

    def forward(self, tokens: np.ndarray, kv: KVCache, all_logits: bool = False, step: Step | None = None) -> tuple:
        n = len(tokens)
        assert all_logits == (n > 1), "a verify batch needs every row's logits, decode its one row's"
        step, x = toy_input(self.device, step or Step(experts=self.experts), tokens, kv)
        dev, g, s = self.device, step.graph, self.device.current
        depth = getattr(g, "prefetch_depth", 0)
        moe = [lw for lw in self.weights.layers if lw.ffn is not None]
        for lw in self.weights.layers:
            if lw.ffn is not None and depth and lw is not moe[-1]:  # MoETransformer.stage_next_guesses' place
                def guess(out, depth=depth) -> None:  # a kernel on the stream the graph makes current
                    def kernel() -> None:
                        np.copyto(out, (x[:, None] * 7 + np.arange(depth)) % N_EXPERT, casting="unsafe")
                        self.guesses_run += 1
                    self.guess_streams.append(dev.current)
                    dev.current.run(kernel)
                g.stage_guesses(moe[moe.index(lw) + 1].ffn, guess)
            if lw.ffn is None:
                s.run(lambda: np.copyto(x, (x * 31 + 5) % 1_000_003))
                continue
            ids = dev.zeros((n, K), np.int32)
            s.run(lambda ids=ids: np.copyto(ids, (x[:, None] + 3 * np.arange(K)) % N_EXPERT, casting="unsafe"))
            tail = self.tails.get(moe_layer_index(lw.ffn))
            if g is not None:
                gate, _up, _down = g.expert_pointers(lw.ffn, ids, tail) if tail is not None else \
                    g.expert_pointers(lw.ffn, ids)
            else:
                got = step.experts.fetch(lw.ffn, experts_by_recency(ids))
                gate = np.array([got[int(e)].gate.data.ptr for e in ids.reshape(-1)], dtype=np.uint64)
                if tail is not None:
                    gate = np.concatenate([gate, np.full(n, tail[0], dtype=np.uint64)])
            assert gate.size == n * K + (n if tail is not None else 0)
            def mix(gate=gate, shared=tail is not None) -> None:
                routed = gate[: n * K].reshape(n, K).sum(axis=1).astype(np.int64)
                np.copyto(x, (x * 3 + routed + (gate[n * K :].astype(np.int64) * 5 if shared else 0)) % 1_000_003)
            s.run(mix)
        kv.advance(n)
        return x, x
