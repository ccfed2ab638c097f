"""Decode, verify and draft graphs kept through the prefill phase transaction on the CUDA backend
(runner/backends/cuda/graph_pool.py; ExpertOffload decides to keep them, tests/test_graph_survival.py).

After a second prompt, whose transaction moved every slot, the first decode step replays the graph captured
before it (no warm-up, no capture), the greedy tokens are a fresh engine's (plain and MTP), and the ledger
holds the graphs' share through the prompt with the graphs' pool beside the default pool's limit.

A fresh model (seed 93, the small preset: 3 MoE layers, top-4 of 16 experts) no other test uses.
"""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.budget import GIB, DeviceBudget  # noqa: E402
from runner.backends.cuda.decode_segments import SegmentedDecodeGraph  # noqa: E402
from runner.backends.cuda.token_graph import DirectoryDecodeGraph  # noqa: E402
from runner.backends.cuda.ops import CudaOps  # noqa: E402
from runner.engine.engine import Engine, EngineConfig  # noqa: E402
from runner.engine.sampling import SamplingParams  # noqa: E402
from runner.offload.offload import PREFILL_BUFFERS, OffloadConfig  # noqa: E402
from runner.spec.config import DraftConfig  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
UBATCH = 16
TOKENS = 40
GRAPHS = "decode graphs"
# The graphs' share is an estimate of their activations and attention partials; on this tiny shape the pool's
# 512-byte rounding of each layer's small arrays (ids, norms, router weights) may pass it by a little.
ROUNDING_PER_GRAPH = 256 << 10


@pytest.fixture(scope="module")
def model(synth_model):
    path = synth_model("glm4moe", "Q4_K_M", preset="small", seed=93, direct=True)
    rng = np.random.default_rng(93)
    return path, [[int(t) for t in rng.integers(3, 500, size=n)] for n in (40, 24)]


GRAPH_KINDS = {"segments": SegmentedDecodeGraph, "directory": DirectoryDecodeGraph}


def _engine(path, depth: int = 0, kind: str = "segments") -> Engine:
    """12 slots per layer of 16 experts: a verify batch of 3 rows fits, and steps still miss and evict."""
    cfg = OffloadConfig(cache_slots=12, decode_batch=1 + depth, prefill_ubatch=UBATCH, transaction="always",
                        decode_graph=kind)
    return Engine.load(path, EngineConfig(n_ctx=256, ubatch=UBATCH, offload=cfg),
                       ops=CudaOps(DeviceBudget(2 * GIB)))


def _captured(graph) -> list:
    """What a graph captured: a segmented graph's segments, a directory graph's one graph."""
    return list(graph.segments) if isinstance(graph, SegmentedDecodeGraph) else [graph.graph]


def _greedy(engine: Engine, prompt: list[int], depth: int = 0) -> list[int]:
    draft = DraftConfig("mtp", depth, adaptive=False) if depth else None
    return engine.generate(prompt, TOKENS, GREEDY, ignore_eos=True, draft=draft).run().tokens


@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_the_first_step_after_a_prompt_replays_the_graph_captured_before_it(model, kind: str) -> None:
    path, (first, second) = model
    engine = _engine(path, kind=kind)
    _greedy(engine, first)
    graph = engine.ops.decode_graph(engine.kv)
    assert type(graph) is GRAPH_KINDS[kind] and graph.captured
    segments, replays, region = _captured(graph), graph.replays, engine.offload.cache.regions[0].serial
    token = int(np.argmax(engine.prefill(second)))
    assert engine.offload.cache.regions[0].serial != region  # the transaction released the slots and reserved anew
    engine.decode(token)
    assert engine.ops.decode_graph(engine.kv) is graph and _captured(graph) == segments  # nothing captured
    assert graph.replays == replays + 1  # the step replayed
    s = engine.stats()
    assert s["graphs"]["kept"] and s["graphs"]["drops"] == 0 and s["phase"]["ends"] == 2 and s["healthy"]


@pytest.mark.parametrize("kind", GRAPH_KINDS)
@pytest.mark.parametrize("depth", [0, 2])
def test_greedy_tokens_after_a_second_prompt_are_a_fresh_engines_with_every_graph_kept(model, depth: int, kind: str,
                                                                                        monkeypatch) -> None:
    path, (first, second) = model
    fresh = _greedy(_engine(path, depth, kind), second, depth)  # run to the end before the next engine is built
    assert len(set(fresh)) > 8
    if kind != "segments":  # every kind of graph decodes the segmented graphs' tokens
        assert fresh == _greedy(_engine(path, depth), second, depth)
    engine = _engine(path, depth, kind)
    _greedy(engine, first, depth)
    graphs = {key: g for key, g in engine.ops._decode_graphs.items() if g.captured}  # decode, verify, draft
    segments = {key: _captured(g) for key, g in graphs.items()}
    replays = sum(g.replays for g in graphs.values())
    kinds = {(key[0] == "draft", key[-1] > 1) for key in graphs}  # (a draft graph, more than one row)
    assert kinds == {(False, False)} if depth == 0 else {(True, False), (False, True)} <= kinds
    offload, budget = engine.offload, engine.offload.budget
    during: dict[str, int] = {}
    free = offload.free_prefill_buffers
    monkeypatch.setattr(offload, "free_prefill_buffers", lambda: during.update(budget.held) or free())
    assert _greedy(engine, second, depth) == fresh
    assert all(engine.ops._decode_graphs.get(key) is g for key, g in graphs.items())  # the same graphs,
    assert all(_captured(g) == segments[key] for key, g in graphs.items())  # none captured again,
    assert sum(g.replays for g in graphs.values()) >= replays + TOKENS // (1 + depth) - 2  # replaying
    # The ledger: the graphs' share held through the prompt, beside its buffers; the default pool's limit
    # leaves it to the graphs' pool, which holds about what it keeps.
    assert GRAPHS in during and PREFILL_BUFFERS in during and "decode workspaces" not in during
    share = budget.held[GRAPHS]
    assert engine.ops.graph_pool.held_bytes <= share + ROUNDING_PER_GRAPH * len(engine.ops._decode_graphs)
    assert cp.get_default_memory_pool().get_limit() == budget.limit_bytes - offload.arena.held_bytes - share
    s = engine.stats()
    assert s["graphs"]["held_bytes"] == engine.ops.graph_pool.held_bytes > 0
    assert s["budget"]["peak_bytes"] <= s["budget"]["limit_bytes"] and s["healthy"] and s["phase"]["ends"] == 2


def test_a_failed_prompt_drops_the_graphs_and_the_engine_decodes_again_after_reset(model) -> None:
    path, (first, second) = model
    expected = _greedy(_engine(path), second)
    engine = _engine(path)
    _greedy(engine, first)
    held = engine.ops.graph_pool.held_bytes
    calls = iter([False, RuntimeError("kernel fault")])

    def cancelled() -> bool:
        step = next(calls)
        if isinstance(step, Exception):
            raise step
        return step

    with pytest.raises(Exception, match="kernel fault"):
        engine.prefill(second, cancelled=cancelled)
    engine.reset()
    assert engine.ops.decode_graph(engine.kv) is None and engine.ops.graph_pool.held_bytes < held  # given back
    assert _greedy(engine, second) == expected
    graph = engine.ops.decode_graph(engine.kv)
    assert graph.replays == TOKENS - 3 and engine.stats()["healthy"]  # captured again: warm-up, capture, replays
