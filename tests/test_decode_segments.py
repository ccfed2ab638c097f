"""Segmented decode graphs (runner/backends/cuda/decode_segments.py) on the CPU, with a stand-in for CuPy.

The stand-in runs "kernels" (Python closures) at once on a stream that is not capturing and records
them on one that is; launching a recorded graph runs them again. That is enough to check the
sequencing: replayed segments and host steps compute what eager steps compute, step after step, with
the same fetches in the same order, all on the graph's stream. The CUDA side is
tests/test_decode_segments_cuda.py.
"""

from __future__ import annotations


from types import SimpleNamespace

import numpy as np
import pytest

from runner.backends.cuda import decode_segments
from runner.backends.cuda.decode_segments import SegmentedDecodeGraph
from runner.backends.cuda.graph_pool import CudaGraphHooks, GraphPool
from runner.backends.step import Step
from runner.engine.kv_cache import KVCache
from runner.errors import CacheError
from runner.models.weights import MoEWeights
from fake_cupy import K, LAYERS, FakeCupy, SlotProvider, ToyModel, address


def _pair(monkeypatch, fail_at: int | None = None, rows: int = 1, n_slots: int = 3, pooled: bool = False,
          tails: dict | None = None):
    """An eager toy and a segmented one of `rows` rows, each with its own stand-in device and provider; `pooled`:
    the graph allocates its warm-up and capture in a GraphPool (graph.pool); `tails`: shared experts folded in."""
    eager_dev, seg_dev = FakeCupy(), FakeCupy()
    monkeypatch.setattr(decode_segments, "_cupy", lambda: seg_dev)
    eager = ToyModel(eager_dev, SlotProvider(eager_dev, fail_at, n_slots), tails)
    seg = ToyModel(seg_dev, SlotProvider(seg_dev, fail_at, n_slots), tails)
    kv_e, kv_s = KVCache(None, 0, 64, 1, 1), KVCache(None, 0, 64, 1, 1)
    pool = GraphPool(seg_dev) if pooled else None
    return eager, kv_e, seg, kv_s, SegmentedDecodeGraph(seg, kv_s, seg.experts, rows, pool=pool)


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


@pytest.mark.parametrize("rows", [1, 3])
def test_a_folded_shared_expert_sits_after_the_routed_pairs_of_tables_made_once_before_the_capture(monkeypatch,
                                                                                                  rows: int) -> None:
    """CudaOps folds a shared expert into the routed experts' launches as one more pair per row: the host steps
    rewrite only the routed pairs, the tail stays where the warm-up wrote it, and replays compute the eager
    steps' results."""
    tails = {1: np.array([9_001, 9_002, 9_003], dtype=np.uint64), 4: np.array([7_001, 7_002, 7_003], dtype=np.uint64)}
    eager, kv_e, seg, kv_s, graph = _pair(monkeypatch, rows=rows, n_slots=6, tails=tails)
    tokens = [5, 11, 2][:rows]
    for i in range(6):
        want = eager.forward(np.asarray(tokens), kv_e, all_logits=rows > 1)[0].tolist()
        assert graph.step(tokens)[0].tolist() == want, f"step {i}"
        tokens = [(t * 13 + i) % 97 for t in tokens]
        if i == 1:
            made = {layer: t for layer, t in graph.tables.items()}
    assert graph.replays >= 4 and all(graph.tables[layer] is t for layer, t in made.items())  # not remade
    for layer, t in graph.tables.items():
        tail = tails.get(layer)
        n = rows * K
        assert t.table.shape == (3, n + (rows if tail is not None else 0))
        if tail is not None:
            assert (np.asarray(t.table)[:, n:] == tail[:, None]).all() and t.routed_host.shape == (3, n)


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


def test_a_graph_warms_up_and_captures_in_its_pool_on_its_stream_and_replays_allocate_nothing(monkeypatch) -> None:
    eager, kv_e, seg, kv_s, graph = _pair(monkeypatch, pooled=True)
    device, pool = seg.device, graph.pool
    made = len(device.allocations)
    steps = [_decode(eager, kv_e, graph, t) for t in (5, 9)]  # the warm-up and the capture
    temporaries = device.allocations[made:]
    assert temporaries and all(a == pool.pool.malloc and s is graph.stream for a, s in temporaries)
    assert device.allocator is None and pool.held_bytes > 0  # the default allocator back after each step
    made = len(device.allocations)
    steps += [_decode(eager, kv_e, graph, t) for t in (2, 7, 7)]
    assert len(device.allocations) == made and graph.replays == 3
    assert [s for s, _ in steps] == [s for _, s in steps]


def _staged(w: MoEWeights, experts: list[int]) -> dict:
    """A prompt's experts, from staging buffers that do not move."""
    return {e: SimpleNamespace(gate=address(900_000 + 10 * e), up=address(0), down=address(0)) for e in experts}


def test_a_kept_graph_replays_at_the_first_step_after_a_prompt_that_moved_every_slot(monkeypatch) -> None:
    """What a phase transaction does around a kept segmented graph: the prompt writes K/V and advances the cache,
    and the slots are released and reserved again elsewhere, cold. Nothing a segment captured holds a slot
    address (each host step writes the tables from the cache), so the graph replays at once and computes
    what eager steps compute, with the same fetches."""
    eager, kv_e, seg, kv_s, graph = _pair(monkeypatch, pooled=True)
    control, kv_c, *_ = _pair(monkeypatch)  # the same steps without the move
    before = [_decode(eager, kv_e, graph, t) for t in (5, 9, 2)]
    for t in (5, 9, 2):
        control.forward(np.asarray([t]), kv_c)
    segments, replays = list(graph.segments), graph.replays
    prompt, staging = np.asarray([4, 1, 8, 8, 3]), Step(experts=SimpleNamespace(fetch=_staged))
    for model, kv in ((eager, kv_e), (seg, kv_s), (control, kv_c)):
        model.forward(prompt, kv, all_logits=True, step=staging)  # the prompt streams its experts, slots unused
    eager.experts.relocate()
    seg.experts.relocate()
    made = len(seg.device.allocations)
    after = [_decode(eager, kv_e, graph, t) for t in (6, 2, 6)]
    assert [s for s, _ in before + after] == [s for _, s in before + after]
    assert graph.segments == segments and graph.replays == replays + 3  # no warm-up, no capture
    assert len(seg.device.allocations) == made and seg.experts.calls == eager.experts.calls
    unmoved = [int(control.forward(np.asarray([t]), kv_c)[0][0]) for t in (6, 2, 6)]
    assert unmoved != [s for s, _ in after]  # the steps did read the new slots


def test_cuda_graph_hooks_drop_graphs_through_the_ops_and_a_pool_releases_a_dropped_graphs_stream() -> None:
    device = FakeCupy()
    pool = GraphPool(device, limit_bytes=1 << 20)
    stream = device.stream()
    pool.release(stream)
    assert pool.pool.limit == 1 << 20 and pool.pool.released == [stream]
    drops: list[int] = []
    hooks = CudaGraphHooks(SimpleNamespace(graph_pool=pool, invalidate_graphs=lambda: drops.append(1)))
    with pool.allocating():
        device.zeros(10, np.float32)
    hooks.restore()
    assert drops == [] and hooks.held_bytes() == 40
    hooks.invalidate()
    assert drops == [1]
