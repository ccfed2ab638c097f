"""Decode graphs under expert offload on the CUDA backend: segmented (runner/backends/cuda/decode_segments.py)
and, where a test is parametrized by kind, directory graphs too (runner/backends/cuda/token_graph.py).

Offloaded decode replayed as one CUDA graph segment per MoE layer's router, plus one, gives the tokens
of offloaded eager decode (CudaOps(graphs=False)) and of the all-resident CUDA path, with the same
cache traffic, also after a second prompt. Fresh models (seeds 91, 92; the small preset: 3 and 4 MoE
layers, top-4 of 16 experts); 4 slots per layer, so most tokens miss and evict in every layer.

Each engine is built and run to the end before the next one is built: a new CudaOps gives the default pool's
cached blocks back to the driver (a live graph's temporaries are in its CudaOps' own graph pool since
graph_pool.py, so this is caution, no longer a requirement).
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
from runner.backends.cuda.ops import CudaOps  # noqa: E402
from runner.backends.cuda.token_graph import DirectoryDecodeGraph  # noqa: E402
from runner.engine.engine import Engine, EngineConfig  # noqa: E402
from runner.engine.sampling import SamplingParams  # noqa: E402
from runner.models.weights import MoEWeights  # noqa: E402
from runner.offload.offload import OffloadConfig  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
UBATCH = 16
TOKENS = 48  # generated per prompt: the first from the prompt, then a warm-up, a capturing step and replays
KINDS = {"segments": SegmentedDecodeGraph, "directory": DirectoryDecodeGraph}
# decode steps a graph's replays leave out: the warm-up, and for segments the capturing step too (DecodeGraph,
# the directory kind's base, counts its capturing step as a replay)
UNCOUNTED = {"segments": 2, "directory": 1}


@pytest.fixture(scope="module", params=[("glm4moe", "Q4_K_M", 91), ("qwen3moe", "Q8_0", 92)], ids=lambda p: p[0])
def model(request, synth_model):
    arch, quant, seed = request.param
    path = synth_model(arch, quant, preset="small", seed=seed, direct=True)
    rng = np.random.default_rng(seed)
    return path, [[int(t) for t in rng.integers(3, 500, size=n)] for n in (40, 24)]


def _offloaded(path, graphs: bool, transaction: str = "always", kind: str = "segments") -> Engine:
    cfg = OffloadConfig(cache_slots=4, prefill_ubatch=UBATCH, transaction=transaction, decode_graph=kind)
    return Engine.load(path, EngineConfig(n_ctx=256, ubatch=UBATCH, offload=cfg),
                       ops=CudaOps(DeviceBudget(2 * GIB), graphs=graphs))


def _greedy(engine: Engine, prompt: list[int], n: int = TOKENS) -> list[int]:
    return engine.generate(prompt, n, GREEDY, ignore_eos=True).run().tokens


def _moe_layers(engine: Engine) -> int:
    return sum(isinstance(lw.ffn, MoEWeights) for lw in engine.model.weights.layers)


@pytest.mark.parametrize("kind", list(KINDS))
def test_graph_decode_gives_the_eager_and_the_resident_tokens_with_the_same_cache_traffic(model, kind: str) -> None:
    path, (prompt, _) = model
    expected = _greedy(Engine.load(path, EngineConfig(n_ctx=256, ubatch=UBATCH), ops=CudaOps()), prompt)
    assert len(set(expected)) > 8
    eager = _offloaded(path, graphs=False)
    eager_tokens, eager_stats = _greedy(eager, prompt), eager.stats()
    assert eager.ops.decode_graph(eager.kv) is None  # graphs=False keeps the eager path
    del eager
    engine = _offloaded(path, graphs=True, kind=kind)
    assert _greedy(engine, prompt) == eager_tokens == expected
    graph = engine.ops.decode_graph(engine.kv)
    assert isinstance(graph, KINDS[kind]) and graph.replays == TOKENS - 1 - UNCOUNTED[kind]
    s = engine.stats()
    assert s["cache"] == eager_stats["cache"]  # hits, misses, evictions, bytes: per layer and in total
    assert s["healthy"] and s["decode_graph"]["kind"] == kind
    if kind == "segments":  # a host fetch per MoE layer and token, as eager; directory graphs: one handoff
        assert s["generation"] == eager_stats["generation"]
    else:
        assert s["decode_graph"]["handoffs"] == 1 and engine.offload.cache.on_device
    assert s["cache"]["total"]["misses"] > TOKENS and s["cache"]["total"]["evictions"] > TOKENS


@pytest.mark.parametrize("kind", list(KINDS))
def test_graph_logits_equal_eager_logits_bitwise_also_after_a_rollback(model, kind: str) -> None:
    path, (prompt, _) = model
    runs = []
    for graphs in (False, True):
        engine = _offloaded(path, graphs, kind=kind)
        token, rows = int(np.argmax(engine.prefill(prompt))), []
        for i in range(20):
            rows.append(engine.decode(token))
            token = int(np.argmax(rows[-1]))
            if i == 11:
                engine.rollback(len(prompt) + 4)  # the same segments serve an earlier position
        runs.append(np.stack(rows))
        del engine
    assert np.array_equal(runs[0], runs[1])


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("transaction", ["always", "never"])
def test_after_a_second_prompt_graph_decode_still_gives_the_eager_tokens(model, transaction: str, kind: str) -> None:
    path, prompts = model
    runs = {}
    for graphs in (False, True):
        engine = _offloaded(path, graphs, transaction, kind)
        tokens, seen, regions = [], [], []
        for prompt in prompts:
            tokens.append(_greedy(engine, prompt))
            seen.append(engine.ops.decode_graph(engine.kv))
            regions.append(engine.offload.cache.regions[0].serial)
        runs[graphs] = tokens, seen, regions, engine.stats()
        del engine
    (eager_tokens, _, _, eager_stats), (tokens, (first, second), regions, stats) = runs[False], runs[True]
    assert tokens == eager_tokens and len(set(tokens[1])) > 8
    assert stats["cache"] == eager_stats["cache"]
    if transaction == "always":  # the phase released and re-reserved the slots and kept the graphs
        assert regions[1] != regions[0] and stats["phase"]["ends"] == 2 and stats["graphs"]["kept"]
    else:  # a prompt through the cache keeps the slots where they are
        assert regions[1] == regions[0] and stats["phase"]["ends"] == 0
    assert second is first and second.replays == 2 * (TOKENS - 1) - UNCOUNTED[kind]  # replaying either way


def test_directory_fills_beside_the_held_pairs_give_the_in_order_logits_bitwise(model, monkeypatch) -> None:
    """OVERLAP_FILLS: the misses' fills on a branch of the graph while the held pairs run, the filled pairs after
    the join; SPLIT_FILLS: their gate-up after the gate and up bytes, their down after the down bytes. The same
    logits, bit for bit, and the same cache traffic as fills in order."""
    path, (prompt, _) = model
    runs = {}
    for overlap, split in ((False, False), (True, False), (True, True)):
        monkeypatch.setattr(DirectoryDecodeGraph, "OVERLAP_FILLS", overlap)
        monkeypatch.setattr(DirectoryDecodeGraph, "SPLIT_FILLS", split)
        engine = _offloaded(path, graphs=True, kind="directory")
        token, rows = int(np.argmax(engine.prefill(prompt))), []
        for _ in range(24):
            rows.append(engine.decode(token))
            token = int(np.argmax(rows[-1]))
        graph = engine.ops.decode_graph(engine.kv)
        assert (graph.fill_stream is not None) == overlap and graph.replays > 20
        runs[overlap, split] = np.stack(rows), engine.stats()["cache"]
        del engine
    in_order = runs[False, False]
    for arm in ((True, False), (True, True)):
        assert np.array_equal(in_order[0], runs[arm][0]) and in_order[1] == runs[arm][1], arm
    assert in_order[1]["total"]["misses"] > 24  # fills happened while the graph replayed


def test_a_step_is_one_segment_per_moe_layer_plus_one_and_replays_allocate_nothing(model) -> None:
    path, (prompt, _) = model
    engine = _offloaded(path, graphs=True)
    pool = cp.get_default_memory_pool()
    token = int(np.argmax(engine.prefill(prompt)))
    for i in range(10):
        token = int(np.argmax(engine.decode(token)))
        if i == 3:  # two replays in
            used, total = pool.used_bytes(), pool.total_bytes()
    assert (pool.used_bytes(), pool.total_bytes()) == (used, total)
    graph = engine.ops.decode_graph(engine.kv)
    n_moe = _moe_layers(engine)
    assert n_moe == engine.model_config.n_layer - (1 if engine.model_config.arch == "glm4moe" else 0)
    assert len(graph.segments) == n_moe + 1 and len(graph.host_steps) == n_moe
    assert graph.replays == 8 and graph.host_step_s > 0 and graph.ids_wait_s > 0


def _verifying(path, graphs: bool, kind: str = "segments") -> Engine:
    """Offload for verify batches of up to 3 rows: 12 slots per layer of 16 experts, so batches still miss."""
    cfg = OffloadConfig(cache_slots=12, decode_batch=3, prefill_ubatch=UBATCH, transaction="always",
                        decode_graph=kind)
    return Engine.load(path, EngineConfig(n_ctx=256, ubatch=UBATCH, offload=cfg),
                       ops=CudaOps(DeviceBudget(2 * GIB), graphs=graphs))


def _verify_steps(engine: Engine, prompt: list[int], sizes: list[int]) -> list[np.ndarray]:
    """Engine.verify of batches of `sizes` rows (the pending token and arbitrary drafts), each followed by
    a rollback to a varying number of accepted rows; every batch's logits and hidden rows."""
    rng = np.random.default_rng(5)
    token, out = int(np.argmax(engine.prefill(prompt))), []
    for n in sizes:
        n_cached = len(engine.kv_tokens)
        logits, hidden = engine.verify([token, *(int(t) for t in rng.integers(3, 500, size=n - 1))])
        out += [logits, engine.ops.to_host(hidden)]
        kept = int(rng.integers(1, n + 1))
        engine.rollback(n_cached + kept)
        token = int(np.argmax(logits[kept - 1]))
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_graph_verify_batches_equal_eager_ones_bitwise_with_the_same_cache_traffic(model, kind: str) -> None:
    path, (prompt, _) = model
    sizes = [2, 3, 1, 3, 2, 2, 3, 1] * 4
    runs = []
    for graphs in (False, True):
        engine = _verifying(path, graphs, kind)
        runs.append((_verify_steps(engine, prompt, sizes), engine.stats()))
        if graphs:
            seen = {rows: engine.ops.decode_graph(engine.kv, rows) for rows in (1, 2, 3)}
            k = engine.model_config.n_expert_used
            # glm4moe's shared expert has the routed experts' types and shapes, so it is folded in: one more pair
            # per row at the end of every table (CudaOps.fold_tail); qwen3moe has none.
            moe = [lw.ffn for lw in engine.model.weights.layers if isinstance(lw.ffn, MoEWeights)]
            folded = engine.ops.fold_tail(moe[0]) is not None
            assert folded == (moe[0].shared is not None)
        del engine
    (eager_rows, eager_stats), (rows, stats) = runs
    assert all(np.array_equal(a, b) for a, b in zip(eager_rows, rows))
    assert stats["cache"] == eager_stats["cache"] and stats["cache"]["total"]["evictions"] > 0
    width = lambda n: n * k + (n if folded else 0)  # noqa: E731
    for n, graph in seen.items():
        assert isinstance(graph, KINDS[kind]) and graph.rows == n
        assert graph.replays == sizes.count(n) - UNCOUNTED[kind]
        if kind == "segments":
            tables = next(iter(graph.tables.values()))
            assert (tables.tail is not None) == folded
            assert tables.ids_host.shape == (n, k) and tables.table.shape == (3, width(n))
        else:
            pairs = next(iter(graph.pairs.values()))
            assert (pairs.tail is not None) == folded and pairs.table.shape == (3, width(n))
