"""Draft steps of the NextN block through the decode graph classes (runner/backends/cuda/draft_graph.py), on
the CPU: the adapter through SegmentedDecodeGraph on test_decode_segments' CuPy stand-in, the adapter's
interface over the real block, and MTPDrafter's use of ops.draft_forward on the numpy backend. The CUDA
side is tests/test_nextn_graph_cuda.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from fake_cupy import K, FakeCupy, FakeStream, SlotProvider, _moe, toy_input

from runner.backends.cuda import decode_segments, draft_graph
from runner.backends.cuda.decode_segments import SegmentedDecodeGraph
from runner.backends.cuda.draft_graph import NextNGraphModel
from runner.backends.limits import SMALL_BATCH_ROWS
from runner.backends.numpy.ops import NumpyOps
from runner.backends.step import RESIDENT, Step
from runner.engine.engine import Engine, EngineConfig
from runner.engine.kv_cache import KVCache
from runner.engine.sampling import SamplingParams
from runner.offload.provider import experts_by_recency, moe_layer_index
from runner.spec.config import DraftConfig

N_EMBD, N_LAYER = 6, 5  # the toy block is blk.5, after a trunk of 5 layers
GREEDY = SamplingParams(temperature=0.0)
PROMPT = [7, 93, 411, 250, 18, 333, 64, 120, 5, 499, 77, 201]


class DraftStream(FakeStream):
    def record(self) -> tuple:
        return ("event", self)

    def wait_event(self, event: tuple) -> None:
        self.device.waits.append((self, event[1]))


class DraftCupy(FakeCupy):
    """The stand-in, plus what the adapter's load takes: the current stream, events and a device copy."""

    float32 = np.float32

    def __init__(self):
        super().__init__()
        self.null = DraftStream(self)
        self.streams, self.streams_made = [self.null], [self.null]
        self.cuda.get_current_stream = lambda: self.current
        self.waits: list[tuple] = []  # (waiting stream, stream of the event)
        self.copies: list[DraftStream] = []  # the stream of each device copy

    def stream(self, non_blocking: bool = False) -> DraftStream:
        self.streams_made.append(DraftStream(self))
        return self.streams_made[-1]

    def copyto(self, dst: np.ndarray, src: np.ndarray) -> None:
        assert not self.current.capturing, "an input copy inside a capture would be frozen into the graph"
        self.copies.append(self.current)
        np.copyto(dst, src)


class ToyNextN:
    """NextNBlock's interface over stand-in kernels: x per row from the token, the position and the hidden
    row (read when the kernel runs), one MoE layer (blk.N_LAYER) as in test_decode_segments' ToyModel, and
    a hidden output made from x."""

    def __init__(self, device: DraftCupy, experts: SlotProvider):
        self.device, self.experts = device, experts
        self.cfg = SimpleNamespace(n_expert_used=K, n_embd=N_EMBD)
        self.weights = SimpleNamespace(layer=SimpleNamespace(ffn=_moe(N_LAYER)))

    def forward(self, hidden, tokens: np.ndarray, kv: KVCache, step: Step | None = None) -> tuple:
        n = len(tokens)
        step, x = toy_input(self.device, step or Step(experts=self.experts), tokens, kv,
                            lambda: (np.asarray(hidden) * 1000).astype(np.int64).sum(axis=1))
        dev, g, s = self.device, step.graph, self.device.current
        ids = dev.zeros((n, K), np.int32)
        s.run(lambda: np.copyto(ids, (x[:, None] + 3 * np.arange(K)) % 8, casting="unsafe"))
        w = self.weights.layer.ffn
        if g is not None:
            gate, _up, _down = g.expert_pointers(w, ids)
        else:
            got = step.experts.fetch(w, experts_by_recency(ids))
            gate = np.array([got[int(e)].gate.data.ptr for e in ids.reshape(-1)], dtype=np.uint64)
        s.run(lambda: np.copyto(x, (x * 3 + gate.reshape(n, K).sum(axis=1).astype(np.int64)) % 1_000_003))
        out = dev.zeros((n, N_EMBD), np.float32)
        s.run(lambda: np.copyto(out, (x[:, None] % 97 + np.arange(N_EMBD)) / 100.0))
        kv.advance(n)
        return x, out


def test_draft_graphs_of_one_to_four_rows_give_the_eager_blocks_outputs_across_rollbacks(monkeypatch) -> None:
    eager_dev, graph_dev = DraftCupy(), DraftCupy()
    monkeypatch.setattr(decode_segments, "_cupy", lambda: graph_dev)
    monkeypatch.setattr(draft_graph, "_cupy", lambda: graph_dev)
    eager = ToyNextN(eager_dev, SlotProvider(eager_dev, n_slots=4 * K + 1))
    block = ToyNextN(graph_dev, SlotProvider(graph_dev, n_slots=4 * K + 1))
    kv_e, kv_g = KVCache(None, 0, 128, 1, 1), KVCache(None, 0, 128, 1, 1)
    graphs = {rows: SegmentedDecodeGraph(NextNGraphModel(block, rows), kv_g, block.experts, rows) for rows in range(1, 5)}
    rng = np.random.default_rng(3)
    sizes = [1, 2, 3, 4, 1, 1, 2, 4, 3, 4, 2, 1, 3, 4, 2, 3, 1]
    hidden_e = hidden_g = None
    for i, rows in enumerate(sizes):
        tokens = rng.integers(0, 500, size=rows)
        if i % 3 == 2 and hidden_e is not None and rows == 1:  # recursion: the block's own last row goes back in
            h_e, h_g = hidden_e[-1:], hidden_g[-1:]  # h_g: a view of a graph's output buffer, maybe this graph's
        else:
            h_e = h_g = rng.random((rows, N_EMBD), dtype=np.float32)
        want_logits, hidden_e = eager.forward(h_e.copy(), tokens, kv_e)
        graph = graphs[rows]
        graph.model.load(h_g, graph.stream)
        logits, hidden_g = graph.step(tokens)
        assert np.array_equal(logits, want_logits) and np.array_equal(hidden_g, hidden_e), i
        if i % 4 == 3:  # a draft's rollback to the trunk entries: the graphs serve the earlier positions
            kv_e.rollback(kv_e.n_tokens - 2)
            kv_g.rollback(kv_g.n_tokens - 2)
    assert kv_g.n_tokens == kv_e.n_tokens
    assert block.experts.calls == eager.experts.calls and {layer for layer, _ in block.experts.calls} == {N_LAYER}
    for rows, graph in graphs.items():
        assert list(graph.tables) == [N_LAYER] and graph.tables[N_LAYER].ids_host.shape == (rows, K)
        assert graph.replays == sizes.count(rows) - 2  # a warm-up step, a capturing step, then replays
    # Every hidden input was copied on its graph's stream, after it waited for the caller's (null) stream.
    assert graph_dev.copies == [graphs[rows].stream for rows in sizes]
    assert graph_dev.waits == [(graphs[rows].stream, graph_dev.null) for rows in sizes]


def test_the_adapter_loads_only_its_row_count(monkeypatch) -> None:
    dev = DraftCupy()
    monkeypatch.setattr(draft_graph, "_cupy", lambda: dev)
    adapter = NextNGraphModel(ToyNextN(dev, SlotProvider(dev)), 2)
    with pytest.raises(ValueError, match="got \\(3, 6\\)"):
        adapter.load(np.zeros((3, N_EMBD), np.float32), dev.stream())
    with pytest.raises(ValueError, match="1 to"):
        NextNGraphModel(adapter.block, SMALL_BATCH_ROWS + 1)


def test_the_adapter_over_the_real_block_is_the_block_with_its_layer_as_the_models(monkeypatch, synth_model) -> None:
    """What the graph classes read: forward (every row's logits whatever all_logits says), cfg, and the
    one layer, numbered after the trunk's so its expert tables key on blk.n_layer."""
    engine = Engine.load(synth_model("glm4moe", "F32", seed=41), EngineConfig(n_ctx=128, ubatch=16))
    block = engine.nextn[0]
    dev = DraftCupy()
    monkeypatch.setattr(draft_graph, "_cupy", lambda: dev)
    rng = np.random.default_rng(0)
    kv_a, kv_b = block.new_kv_cache(64), block.new_kv_cache(64)
    for rows in (1, 2, 3, 4):
        adapter = NextNGraphModel(block, rows)
        assert adapter.cfg is block.cfg
        assert [moe_layer_index(lw.ffn) for lw in adapter.weights.layers] == [engine.model_config.n_layer]
        hidden = rng.standard_normal((rows, block.cfg.n_embd)).astype(np.float32)
        tokens = rng.integers(3, 500, size=rows)
        adapter.load(hidden, dev.stream())
        got = adapter.forward(tokens, kv_a, all_logits=rows > 1)
        want = block.forward(hidden, tokens, kv_b)
        assert got[0].shape == (rows, block.cfg.n_vocab)
        assert all(np.array_equal(a, b) for a, b in zip(got, want)) and kv_a.n_tokens == kv_b.n_tokens


class DraftRecordingOps(NumpyOps):
    """NumpyOps that records each draft_forward's row count, and says every draft step warms up a graph."""

    def __init__(self):
        super().__init__()
        self.draft_rows: list[int] = []
        self.eager_rows: list[int] = []

    def draft_forward(self, block, hidden, tokens, kv, step=RESIDENT):
        self.draft_rows.append(len(tokens))
        return super().draft_forward(block, hidden, tokens, kv, step)

    def graph_warming(self, kv, rows, draft=False):
        return draft


def test_mtp_draft_steps_go_through_draft_forward_and_stay_lossless(synth_model) -> None:
    path = synth_model("glm4moe", "F32", seed=41)
    plain = Engine.load(path, EngineConfig(n_ctx=512, ubatch=10)).generate(PROMPT, 60, GREEDY, ignore_eos=True).run()
    ops = DraftRecordingOps()
    engine = Engine.load(path, EngineConfig(n_ctx=512, ubatch=10), ops=ops)
    block_forward = engine.nextn[0].forward
    engine.nextn[0].forward = lambda h, t, *a: ops.eager_rows.append(len(t)) or block_forward(h, t, *a)
    gen = engine.generate(PROMPT, 60, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 3, adaptive=False)).run()
    assert gen.tokens == plain.tokens and gen.draft.verify_steps > 5
    # The prompt's 12 states: one eager batch of 10 (ubatch, past SMALL_BATCH_ROWS), then 2 rows through
    # draft_forward; later feeds are the accepted drafts and the pending token, the recursion 1 row at a time.
    assert ops.eager_rows[0] == 10 and ops.draft_rows[0] == 2
    assert all(1 <= r <= 4 for r in ops.draft_rows) and ops.draft_rows.count(1) > gen.draft.verify_steps
    assert len(ops.eager_rows) == 1 + len(ops.draft_rows)  # draft_forward runs the block eagerly on numpy


def test_draft_steps_that_warm_up_a_graph_leave_the_draft_cost_unmeasured(synth_model) -> None:
    path = synth_model("glm4moe", "F32", seed=41)
    timed = Engine.load(path, EngineConfig(n_ctx=512, ubatch=16))
    timed.generate(PROMPT, 30, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 2)).run()
    assert timed._draft_policy.draft_step_s is not None
    warming = Engine.load(path, EngineConfig(n_ctx=512, ubatch=16), ops=DraftRecordingOps())
    warming.generate(PROMPT, 30, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 2)).run()
    assert warming._draft_policy.draft_step_s is None
