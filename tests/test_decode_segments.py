"""Segmented decode graphs (runner/backends/cuda/decode_segments.py) on the CPU, with a stand-in for CuPy.

The stand-in runs "kernels" (Python closures) at once on a stream that is not capturing and records
them on one that is; launching a recorded graph runs them again. That is enough to check the
sequencing: replayed segments and host steps compute what eager steps compute, step after step, with
the same fetches in the same order, all on the graph's stream. The CUDA side is
tests/test_decode_segments_cuda.py.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from runner.backends.cuda import decode_segments
from runner.backends.cuda.decode_segments import SegmentedDecodeGraph
from runner.backends.step import Step
from runner.engine.kv_cache import KVCache
from runner.errors import CacheError
from runner.models.weights import MoEWeights
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
        kernels, self.recording = self.recording, None
        return FakeGraph(kernels)

    def synchronize(self) -> None:
        assert not self.capturing

    def run(self, kernel) -> None:
        if self.recording is not None:
            self.recording.append(kernel)
        else:
            kernel()


class FakeCupy:
    """What decode_segments takes from CuPy: streams, zeroed device arrays, pinned host memory."""

    int32, int64, uint64 = np.int32, np.int64, np.uint64

    def __init__(self):
        self.null = FakeStream(self)
        self.streams = [self.null]
        self.streams_made = [self.null]
        self.cuda = SimpleNamespace(Stream=self.stream, alloc_pinned_memory=bytearray,
                                    runtime=SimpleNamespace(memcpyAsync=self.memcpy))

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
        return np.zeros(shape, dtype=dtype).view(DeviceArray)


def _address(value: int) -> SimpleNamespace:
    return SimpleNamespace(data=SimpleNamespace(ptr=value))


class SlotProvider:
    """An LRU of n_slots per layer whose addresses depend on history (the slot an expert was loaded into)."""

    def __init__(self, device: FakeCupy, fail_at: int | None = None, n_slots: int = 3):
        self.device, self.fail_at, self.n_slots = device, fail_at, n_slots
        self.slot_of: dict[int, dict[int, int]] = {}  # layer -> expert -> slot, least recent first
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
        base = {e: 1000 * layer + 10 * held[e] for e in experts}
        return {e: SimpleNamespace(gate=_address(b), up=_address(b + 1), down=_address(b + 2)) for e, b in base.items()}

    def fetch_pair_addresses(self, w: MoEWeights, ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        got = self.fetch(w, experts_by_recency(ids))
        for p, e in enumerate(np.asarray(ids).reshape(-1).tolist()):
            out[:, p] = [getattr(got[e], m).data.ptr for m in MATRICES]
        return out


def _moe(layer: int) -> MoEWeights:
    return MoEWeights(None, None, SimpleNamespace(name=f"blk.{layer}.ffn_gate_exps.weight"), None, None, None)


class ToyModel:
    """Per row, x from the token and position; a dense layer mixes x; an MoE layer routes on x and adds
    the gate addresses of the row's experts (what the tables say when the kernel runs)."""

    def __init__(self, device: FakeCupy, experts: SlotProvider):
        self.device = device
        self.cfg = SimpleNamespace(n_expert_used=K)
        self.weights = SimpleNamespace(layers=[SimpleNamespace(ffn=_moe(i) if kind == "moe" else None)
                                               for i, kind in enumerate(LAYERS)])
        self.experts = experts  # the provider its eager forwards fetch from

    def forward(self, tokens: np.ndarray, kv: KVCache, all_logits: bool = False, step: Step | None = None) -> tuple:
        n = len(tokens)
        assert all_logits == (n > 1), "a verify batch needs every row's logits, decode its one row's"
        kv.positions(n)
        step = step or Step(experts=self.experts)
        dev, g, s = self.device, step.graph, self.device.current
        token = g.token if g is not None else np.asarray(tokens)
        position = g.position if g is not None else np.arange(kv.n_tokens, kv.n_tokens + n)
        x = dev.zeros(n, np.int64)
        s.run(lambda: np.copyto(x, np.asarray(token, np.int64) * 7 + np.asarray(position, np.int64)))
        for lw in self.weights.layers:
            if lw.ffn is None:
                s.run(lambda: np.copyto(x, (x * 31 + 5) % 1_000_003))
                continue
            ids = dev.zeros((n, K), np.int32)
            s.run(lambda ids=ids: np.copyto(ids, (x[:, None] + 3 * np.arange(K)) % N_EXPERT, casting="unsafe"))
            if g is not None:
                gate, _up, _down = g.expert_pointers(lw.ffn, ids)
            else:
                got = step.experts.fetch(lw.ffn, experts_by_recency(ids))
                gate = np.array([got[int(e)].gate.data.ptr for e in ids.reshape(-1)], dtype=np.uint64)
            s.run(lambda gate=gate: np.copyto(x, (x * 3 + gate.reshape(n, K).sum(axis=1).astype(np.int64))
                                              % 1_000_003))
        kv.advance(n)
        return x, x


def _pair(monkeypatch, fail_at: int | None = None, rows: int = 1, n_slots: int = 3):
    """An eager toy and a segmented one of `rows` rows, each with its own stand-in device and provider."""
    eager_dev, seg_dev = FakeCupy(), FakeCupy()
    monkeypatch.setattr(decode_segments, "_cupy", lambda: seg_dev)
    eager = ToyModel(eager_dev, SlotProvider(eager_dev, fail_at, n_slots))
    seg = ToyModel(seg_dev, SlotProvider(seg_dev, fail_at, n_slots))
    kv_e, kv_s = KVCache(None, 0, 64, 1, 1), KVCache(None, 0, 64, 1, 1)
    return eager, kv_e, seg, kv_s, SegmentedDecodeGraph(seg, kv_s, seg.experts, rows)


def _decode(eager, kv_e, graph, token: int) -> tuple[int, int]:
    want = int(eager.forward(np.asarray([token]), kv_e)[0][0])
    return want, int(graph.step([token])[0][0])


def _verify(eager, kv_e, graph, tokens: list[int]) -> tuple[list[int], list[int]]:
    want = eager.forward(np.asarray(tokens), kv_e, all_logits=True)[0].tolist()
    return want, graph.step(tokens)[0].tolist()


def test_replayed_segments_compute_what_eager_steps_compute_with_the_same_fetches(monkeypatch) -> None:
    eager, kv_e, seg, kv_s, graph = _pair(monkeypatch)
    tokens = [5, 9, 2, 7, 7, 1, 3, 8, 8, 4]
    steps = [_decode(eager, kv_e, graph, t) for t in tokens]
    assert [s for s, _ in steps] == [s for _, s in steps]
    assert len(set(s for s, _ in steps)) > 5  # outputs that depend on token, position and the slots
    assert seg.experts.calls == eager.experts.calls
    assert all(s is graph.stream for s in seg.experts.streams)  # uploads and waits order on the graph stream
    n_moe = LAYERS.count("moe")
    assert len(graph.segments) == n_moe + 1 and len(graph.host_steps) == n_moe
    assert graph.replays == len(tokens) - 2  # a warm-up step, a capturing step, then replays
    assert kv_s.n_tokens == kv_e.n_tokens == len(tokens)
    kv_e.truncate(4)
    kv_s.truncate(4)  # a rollback: the same segments serve the earlier position
    steps = [_decode(eager, kv_e, graph, t) for t in (6, 2)]
    assert [s for s, _ in steps] == [s for _, s in steps] and graph.replays == len(tokens)


def test_a_capture_that_fails_leaves_no_segments_and_the_next_step_captures_again(monkeypatch) -> None:
    eager, kv_e, seg, kv_s, graph = _pair(monkeypatch, fail_at=LAYERS.count("moe") + 1)  # step 2, second router
    assert len(set(_decode(eager, kv_e, graph, 5))) == 1
    with pytest.raises(CacheError):
        eager.forward(np.asarray([9]), kv_e)
    with pytest.raises(CacheError):
        graph.step([9])
    assert kv_s.n_tokens == kv_e.n_tokens == 1
    assert graph.segments == [] and graph.host_steps == [] and not graph.stream.capturing
    steps = [_decode(eager, kv_e, graph, t) for t in (9, 4, 4, 6)]
    assert [s for s, _ in steps] == [s for _, s in steps]
    assert seg.experts.calls == eager.experts.calls
    assert len(graph.segments) == LAYERS.count("moe") + 1 and graph.replays == 3


def test_a_verify_graph_replays_its_rows_with_the_eager_batch_results_and_fetches(monkeypatch) -> None:
    """A graph of 3 rows: ids [3, k] per layer, tables of 3 * k pairs, positions n_tokens..n_tokens + 2."""
    rows = 3
    eager, kv_e, seg, kv_s, graph = _pair(monkeypatch, rows=rows, n_slots=rows * K + 1)
    batches = [[5, 9, 2], [7, 7, 1], [3, 8, 8], [4, 0, 6], [2, 2, 2], [1, 5, 9]]
    steps = [_verify(eager, kv_e, graph, b) for b in batches]
    assert [s for s, _ in steps] == [s for _, s in steps]
    assert len({v for s, _ in steps for v in s}) > 10  # rows differ by token, position and slots
    assert seg.experts.calls == eager.experts.calls
    assert all(len(experts) > K for _, experts in seg.experts.calls)  # the batch's rows fetch together
    first = next(iter(graph.tables.values()))
    assert first.ids_host.shape == (rows, K) and first.table.shape == (3, rows * K)
    assert graph.replays == len(batches) - 2 and kv_s.n_tokens == kv_e.n_tokens == rows * len(batches)
    kv_e.truncate(4)
    kv_s.truncate(4)  # a rollback to the accepted rows: the same segments serve the earlier positions
    steps = [_verify(eager, kv_e, graph, b) for b in ([6, 2, 3], [0, 1, 2])]
    assert [s for s, _ in steps] == [s for _, s in steps] and graph.replays == len(batches)
    with pytest.raises(ValueError, match="3 rows got 2"):
        graph.step([1, 2])


def test_a_graph_takes_one_to_small_batch_rows(monkeypatch) -> None:
    from runner.backends.limits import SMALL_BATCH_ROWS

    for rows in (0, SMALL_BATCH_ROWS + 1):
        with pytest.raises(ValueError, match="1 to"):
            _pair(monkeypatch, rows=rows)
