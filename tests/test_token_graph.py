"""Directory decode graphs (runner/backends/cuda/token_graph.py) on the CPU, with the CuPy stand-in of
tests/fake_cupy.py and the device directories' numpy twin standing in for the kernels.

What this checks is the sequencing: the warm-up step serves each router from the directories once, the
capturing step records the directory kernels without serving, every replay serves each router once, so a
replayed step computes what an eager step through the host's bookkeeping computes, step after step; the
bookkeeping is handed to the device before a step and taken back by a host-side use in between. The
kernels are held to the twin on the GPU (tests/test_slot_directory_cuda.py; engines: tests/test_decode_segments_cuda.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fake_cupy import K, LAYERS, N_EXPERT, FakeCupy, ToyModel
from runner.backends.cuda import decode_graph
from runner.backends.cuda.token_graph import DirectoryDecodeGraph
from runner.engine.kv_cache import KVCache
from runner.offload.provider import moe_layer_index
from runner.offload.slot_directory import SlotDirectory

MOE_LAYERS = [i for i, kind in enumerate(LAYERS) if kind == "moe"]


def _addresses(layer: int, slots: np.ndarray) -> np.ndarray:
    """Each pair's gate, up and down address in a slot (SlotProvider's: they depend on the slot)."""
    base = (1000 * layer + 10 * slots.astype(np.int64)).astype(np.uint64)
    return np.stack([base, base + np.uint64(1), base + np.uint64(2)])


class TwinDirectories:
    """DeviceDirectories' step interface on the stand-in: serve() is a 'kernel' on the current stream."""

    def __init__(self, device: FakeCupy, n_slots: int):
        self.device = device
        self.twins = {i: SlotDirectory(N_EXPERT, n_slots) for i in MOE_LAYERS}
        self.served = 0
        self.log: list[tuple[str, int, list]] = []  # ("serve" or "prefetch", layer, ids) as the 'kernels' ran
        self.pending: list[tuple[int, object]] = []  # (layer, the prefetch buffers a serve took as pending)
        self.early: list[bool] = []  # each serve's `early`
        self.afters: list = []  # each prefetch's guess event

    def pair_buffers(self, rows: int, k: int, tail=None) -> SimpleNamespace:
        assert tail is None, "the toy model has no shared expert to fold"
        return SimpleNamespace(table=self.device.zeros((3, rows * k), np.uint64), tail=None)

    def serve(self, layer: int, ids, out, fill_stream=None, split: bool = False, pending=None,
              early: bool = False) -> None:
        """The directory as one 'kernel'; the stand-in has no fills to put on `fill_stream`, so it returns no
        event (the graph then runs the expert kernels in one pass, as with fills in order). `early` is logged:
        a serve right behind its router may copy the directory in before its PDL wait."""
        self.pending.append((layer, pending))
        self.early.append(early)
        def kernel() -> None:
            self.served += 1
            self.log.append(("serve", layer, np.asarray(ids).tolist()))
            slots, _fills = self.twins[layer].serve(np.asarray(ids))
            out.table[:] = _addresses(layer, slots)

        self.device.current.run(kernel)

    def prefetch_buffers(self, rows: int, d: int) -> SimpleNamespace:
        return SimpleNamespace(fills=self.device.zeros((rows * d, 2), np.int32),
                               guesses=self.device.zeros((rows, d), np.int32))

    def prefetch(self, layer: int, guesses, out, fill_stream=None, after=None):
        """The prefetch 'kernel' on the current stream (the stand-in orders everything in one stream) after the
        guess's event `after`; with a fill stream, the event after its walk, as DeviceDirectories.prefetch gives it."""
        self.afters.append(after)
        assert guesses is out.guesses, "the walk reads the guesses from the layer's buffers, which outlive the step"
        def kernel() -> None:
            self.log.append(("prefetch", layer, np.asarray(guesses).tolist()))
            self.twins[layer].prefetch(np.asarray(guesses))

        self.device.current.run(kernel)
        return SimpleNamespace(recorded=True) if fill_stream is not None else None


class TwinOffload:
    """What the graph takes from ExpertOffload: the directories, the handoff, and (eager steps) fetch, served
    from host twins that the handoff copies to the device twins and back."""

    decode_graph = "directory"

    def __init__(self, device: FakeCupy, n_slots: int):
        self.cache = SimpleNamespace(layer_slots=lambda layer: n_slots)
        self.host = {i: SlotDirectory(N_EXPERT, n_slots) for i in MOE_LAYERS}
        self.directories = TwinDirectories(device, n_slots)
        self.on_device, self.handoffs, self.pushes, self.pulls = False, 0, 0, 0

    def device_directories(self) -> TwinDirectories:
        return self.directories

    def hand_to_device(self) -> None:
        self.handoffs += 1
        if not self.on_device:
            for i, twin in self.host.items():
                self.directories.twins[i].load(twin.state())
            self.on_device, self.pushes = True, self.pushes + 1

    def fetch(self, w, experts: list[int]) -> dict:
        layer = moe_layer_index(w)
        if self.on_device:  # a host-side use takes the bookkeeping back
            for i, twin in self.directories.twins.items():
                self.host[i].load(twin.state())
            self.on_device, self.pulls = False, self.pulls + 1
        self.host[layer].serve(np.asarray([experts], dtype=np.int32))  # one row: wanted == experts
        table = _addresses(layer, self.host[layer].slot_of[np.asarray(experts)])
        return {e: SimpleNamespace(**{m: SimpleNamespace(data=SimpleNamespace(ptr=int(table[j, n])))
                                      for j, m in enumerate(("gate", "up", "down"))})
                for n, e in enumerate(experts)}


def _pair(monkeypatch, rows: int = 1, n_slots: int = 3):
    eager_dev, graph_dev = FakeCupy(), FakeCupy()
    monkeypatch.setattr(decode_graph, "_cupy", lambda: graph_dev)
    eager = ToyModel(eager_dev, TwinOffload(eager_dev, n_slots))
    toy = ToyModel(graph_dev, TwinOffload(graph_dev, n_slots))
    kv_e, kv_g = KVCache(None, 0, 64, 1, 1), KVCache(None, 0, 64, 1, 1)
    return eager, kv_e, toy, kv_g, DirectoryDecodeGraph(toy, kv_g, toy.experts, rows)


def _run(eager, kv_e, graph, tokens: list[int]) -> tuple[list[int], list[int]]:
    want = eager.forward(np.asarray(tokens), kv_e, all_logits=len(tokens) > 1)[0].tolist()
    return want, graph.step(tokens)[0].tolist()


def _counts(twins: dict[int, SlotDirectory]) -> list[tuple[int, int, int]]:
    return [(t.counters.hits, t.counters.misses, t.counters.evictions) for t in twins.values()]


@pytest.mark.parametrize("early", [False, True])
def test_replayed_steps_compute_what_eager_steps_compute_serving_each_router_once(monkeypatch, early: bool) -> None:
    monkeypatch.setattr(DirectoryDecodeGraph, "EARLY_SERVE", early)
    eager, kv_e, toy, kv_g, graph = _pair(monkeypatch)
    tokens = [5, 9, 2, 7, 7, 1, 3, 8, 8, 4]
    steps = [_run(eager, kv_e, graph, [t]) for t in tokens]
    assert [w for w, _ in steps] == [g for _, g in steps]
    assert len({w[0] for w, _ in steps}) > 5  # outputs that depend on token, position and the slots
    # once a step: the warm-up runs them, the capture records them without running and launches them once
    assert toy.experts.directories.served == len(MOE_LAYERS) * len(tokens)
    assert _counts(toy.experts.directories.twins) == _counts(eager.experts.host)
    asked = toy.experts.directories.early  # every serve, right behind its router, as EARLY_SERVE says
    assert asked and set(asked) == {early}
    for i in MOE_LAYERS:
        assert np.array_equal(toy.experts.directories.twins[i].slot_of, eager.experts.host[i].slot_of)
    assert graph.replays == len(tokens) - 1 and graph.captured  # DecodeGraph counts the capturing step
    assert toy.experts.handoffs == len(tokens) and toy.experts.pushes == 1 and toy.experts.pulls == 0
    assert kv_g.n_tokens == kv_e.n_tokens == len(tokens)


def test_a_host_side_use_between_steps_takes_the_bookkeeping_back_and_the_next_step_hands_it_over(monkeypatch) -> None:
    eager, kv_e, toy, kv_g, graph = _pair(monkeypatch, n_slots=2 * K)
    for t in (5, 9, 2):
        assert len(set(map(tuple, _run(eager, kv_e, graph, [t])))) == 1
    # an eager step of the graph's model through the same provider (a verify batch too big for a graph)
    want = eager.forward(np.asarray([4, 6]), kv_e, all_logits=True)[0].tolist()
    assert toy.forward(np.asarray([4, 6]), kv_g, all_logits=True)[0].tolist() == want
    assert toy.experts.pulls == 1 and not toy.experts.on_device
    steps = [_run(eager, kv_e, graph, [t]) for t in (1, 3, 3, 0)]
    assert [w for w, _ in steps] == [g for _, g in steps] and toy.experts.pushes == 2
    for i in MOE_LAYERS:
        assert np.array_equal(toy.experts.directories.twins[i].slot_of, eager.experts.host[i].slot_of)


def test_a_prefetching_graph_serves_each_layer_after_the_guesses_at_it_in_step_order(monkeypatch) -> None:
    """PREFETCH_DEPTH: every replay runs serve(first MoE layer), then the next layer's prefetch of the guesses the
    model staged, then its serve, and so on (none after the last); the device's directories end as a twin given
    the same calls in that order, and the guesses changed what they hold."""
    monkeypatch.setattr(DirectoryDecodeGraph, "PREFETCH_DEPTH", 2)
    eager, kv_e, toy, kv_g, graph = _pair(monkeypatch, n_slots=2 * K)
    assert graph.prefetch_depth == 2
    tokens = [5, 9, 2, 7, 7, 1, 3]
    for t in tokens:
        graph.step([t])
    log = toy.experts.directories.log
    per_step = [("serve", MOE_LAYERS[0])] + [x for layer in MOE_LAYERS[1:] for x in (("prefetch", layer),
                                                                                      ("serve", layer))]
    assert [(kind, layer) for kind, layer, _ in log] == per_step * len(tokens)  # warm-up, capture's launch, replays
    assert all(np.shape(ids) == (1, 2) for kind, _, ids in log if kind == "prefetch")
    # each serve after a prefetch of its layer takes that prefetch's buffers as pending (their fills may still cross)
    assert graph.fill_stream is not None
    pending = toy.experts.directories.pending
    assert len(pending) == len(MOE_LAYERS) * 2  # the warm-up's and the capture's serves; replays re-run kernels
    assert all(p is (graph.prefetches[layer] if layer != MOE_LAYERS[0] else None) for layer, p in pending)
    replayed = {i: SlotDirectory(N_EXPERT, 2 * K) for i in MOE_LAYERS}
    for kind, layer, ids in log:
        getattr(replayed[layer], kind)(np.asarray(ids, dtype=np.int32))
    for i in MOE_LAYERS:
        assert np.array_equal(replayed[i].slot_of, toy.experts.directories.twins[i].slot_of)
    assert sum(t.counters.prefetched for t in replayed.values()) > 0
    # the guesses ran on the guess stream (beside the routers), every step: the capture drew that stream in, and
    # each prefetch waited for its guess's event
    assert graph.guess_stream is not None and set(toy.guess_streams) == {graph.guess_stream}
    assert toy.guesses_run == len(tokens) * (len(MOE_LAYERS) - 1)
    assert all(a is not None and a.recorded for a in toy.experts.directories.afters)


def test_a_verify_graph_serves_its_rows_together(monkeypatch) -> None:
    rows = 3
    eager, kv_e, toy, kv_g, graph = _pair(monkeypatch, rows=rows, n_slots=rows * K + 1)
    batches = [[5, 9, 2], [7, 7, 1], [3, 8, 8], [4, 0, 6], [2, 2, 2]]
    steps = [_run(eager, kv_e, graph, b) for b in batches]
    assert [w for w, _ in steps] == [g for _, g in steps]
    assert _counts(toy.experts.directories.twins)[0][0] > 0  # rows met experts the batch before held
    kv_e.truncate(4)
    kv_g.truncate(4)  # a rollback: the same graph serves the earlier positions
    steps = [_run(eager, kv_e, graph, b) for b in ([6, 2, 3], [0, 1, 2])]
    assert [w for w, _ in steps] == [g for _, g in steps]


def test_a_graph_wider_than_the_slots_is_refused(monkeypatch) -> None:
    with pytest.raises(ValueError, match="needs 6 slots per layer, the cache has 5"):
        _pair(monkeypatch, rows=3, n_slots=5)


def test_the_model_stages_each_next_moe_layers_guesses_from_this_layers_input() -> None:
    """MoETransformer.stage_next_guesses, as a prefetching graph sees it (numpy backend, the demo model: a dense
    layer, then four MoE layers): before each MoE layer but the last, the next MoE layer's norm and router applied
    to this layer's feed-forward input, `prefetch_depth` deep, its own selection rule."""
    import dataclasses

    from runner.backends.numpy.ops import NumpyOps
    from runner.backends.step import Step
    from runner.engine.engine import Engine, EngineConfig
    from runner.models.weights import MoEWeights
    from runner.package_data import demo_model_path

    class Inputs(NumpyOps):  # keeps each norm_route call's input by router
        def __init__(self) -> None:
            super().__init__()
            self.inputs: dict[str, np.ndarray] = {}

        def norm_route(self, x, norm, eps, router, probs_bias, cfg, beside=False):
            assert beside == (cfg.n_expert_used != model.cfg.n_expert_used)  # a guess runs beside the routers
            if not beside:  # a layer's own routing, not a guess
                self.inputs[router.name] = np.array(x)
            return super().norm_route(x, norm, eps, router, probs_bias, cfg, beside)

    staged: list[tuple[str, np.ndarray]] = []

    def stage(w, guess) -> None:
        out = np.full((1, 3), -1, dtype=np.int32)
        guess(out)
        staged.append((w.router.name, out))

    graph = SimpleNamespace(prefetch_depth=3, stage_guesses=stage)
    ops = Inputs()
    engine = Engine.load(demo_model_path(), EngineConfig(n_ctx=64), ops=ops)
    model = engine.model
    model.forward(np.asarray([11]), engine.kv, step=Step(graph=graph))
    moe = [lw for lw in model.weights.layers if isinstance(lw.ffn, MoEWeights)]
    assert [name for name, _ in staged] == [lw.ffn.router.name for lw in moe[1:]]
    deeper = dataclasses.replace(model.cfg, n_expert_used=3)
    reference = NumpyOps()
    for (name, ids), here, nxt in zip(staged, moe, moe[1:]):
        x = ops.inputs[here.ffn.router.name]
        want, _ = reference.route(reference.linear(reference.rms_norm(x, nxt.ffn_norm, model.cfg.rms_eps), nxt.ffn.router),
                                  nxt.ffn.probs_bias, deeper)
        assert np.array_equal(ids, want) and ids.shape == (1, 3), name
