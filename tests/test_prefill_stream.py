"""Prefill streaming: both orders give the same logits and KV (bit for bit with one micro-batch per
feed-forward group; to float32 rounding when layer-major groups micro-batches, since numpy's BLAS
products are not row-invariant), and their bytes are analytic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runner.backends.budget import GIB, DeviceBudget
from runner.backends.numpy.ops import NumpyOps
from runner.errors import CacheError
from runner.gguf_file import open_gguf
from runner.models import MoETransformer
from runner.models.config import model_config
from runner.models.weights import load_weights
from runner.offload.device_arena import EmulatedDeviceArena
from runner.offload.host_store import HostExpertStore
from runner.offload.prefill_stream import PrefillStream, schedule, stream_prompt
from runner.offload.slot_cache import ExpertSlotCache

N_CTX = 64


@pytest.fixture(scope="module")
def parts(synth_model):
    f = open_gguf(synth_model("glm4moe", "Q8_0"))
    cfg = model_config(f)
    weights = load_weights(f, cfg)
    return cfg, weights, HostExpertStore(weights)


def _run(parts, tokens, order, ubatch, cache_slots=0, warm=None, all_logits=False, group_tokens=None):
    cfg, weights, store = parts
    arena = EmulatedDeviceArena(DeviceBudget(GIB))
    cache = ExpertSlotCache(store, arena, cache_slots) if cache_slots else None
    if cache is not None and warm:
        cache.release()
        cache.restore(warm)
    stream = PrefillStream(store, arena, cache)
    stream.open()
    model = MoETransformer(cfg, weights, NumpyOps())
    kv = model.new_kv_cache(N_CTX)
    out = stream_prompt(model, stream, tokens, kv, order, ubatch, all_logits=all_logits,
                        group_tokens=group_tokens or ubatch)
    return [logits for logits, _ in out], kv, stream, arena


def _trunk_set_bytes(parts) -> int:
    cfg, _, store = parts
    return sum(store.layer_bytes(i) for i in store.layers if i < cfg.n_layer)


def test_schedules_visit_layers_per_microbatch_or_once() -> None:
    assert schedule("per_microbatch", [1, 2], 3) == [1, 2, 1, 2, 1, 2]
    assert schedule("layer_major", [1, 2], 3) == [1, 2]
    with pytest.raises(CacheError, match="unknown prefill order"):
        schedule("sideways", [1], 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("n_tokens,ubatch", [(1, 4), (8, 4), (23, 5), (40, 16)])
def test_layer_major_equals_per_microbatch_bit_for_bit_and_each_uploads_its_analytic_bytes(parts, n_tokens, ubatch) -> None:
    tokens = list(range(100, 100 + n_tokens))
    a_logits, a_kv, a_stream, a_arena = _run(parts, tokens, "per_microbatch", ubatch, all_logits=True)
    b_logits, b_kv, b_stream, b_arena = _run(parts, tokens, "layer_major", ubatch, all_logits=True)
    grouped, *_ = _run(parts, tokens, "layer_major", ubatch, all_logits=True, group_tokens=4 * ubatch)
    for x, y, z in zip(a_logits, b_logits, grouped):
        assert np.array_equal(x, y)
        np.testing.assert_allclose(z, x, rtol=0, atol=2e-4 * np.abs(x).max())
    assert a_kv.n_tokens == b_kv.n_tokens == n_tokens
    for layer in range(len(a_kv.k)):
        assert np.array_equal(a_kv.k[layer][:n_tokens], b_kv.k[layer][:n_tokens])
        assert np.array_equal(a_kv.v[layer][:n_tokens], b_kv.v[layer][:n_tokens])
    crossings = math.ceil(n_tokens / ubatch)
    set_bytes = _trunk_set_bytes(parts)
    assert a_stream.last.total_bytes == a_arena.bytes_uploaded == set_bytes * crossings
    assert b_stream.last.total_bytes == b_arena.bytes_uploaded == set_bytes
    assert a_stream.last.to_dict(set_bytes)["expert_sets"] == crossings
    assert all(v == crossings for v in a_stream.last.visits.values())


def test_streamed_prefill_equals_the_resident_forward(parts) -> None:
    cfg, weights, _ = parts
    tokens = np.arange(200, 223)
    model = MoETransformer(cfg, weights, NumpyOps())
    kv = model.new_kv_cache(N_CTX)
    resident = [model.forward(tokens[s : s + 8], kv)[0] for s in range(0, 23, 8)]
    streamed, *_ = _run(parts, tokens.tolist(), "layer_major", 8)
    assert all(np.array_equal(x, y) for x, y in zip(resident, streamed))


@pytest.mark.parametrize("order", ["per_microbatch", "layer_major"])
def test_experts_the_cache_holds_are_skipped_and_served_from_their_slots(parts, order) -> None:
    tokens, ubatch = list(range(300, 330)), 8
    warm = {1: [0, 3, 5], 2: [7]}  # layer 3 is the NextN block: never streamed by the trunk
    plain, *_ = _run(parts, tokens, order, ubatch)
    logits, _, stream, arena = _run(parts, tokens, order, ubatch, cache_slots=3, warm=warm)
    assert all(np.array_equal(x, y) for x, y in zip(plain, logits))
    _, _, store = parts
    crossings = 4 if order == "per_microbatch" else 1
    skipped = sum(len(v) * store.expert_bytes(layer) for layer, v in warm.items())
    assert stream.last.total_bytes == (_trunk_set_bytes(parts) - skipped) * crossings
    assert sum(stream.last.skipped.values()) == 4 * crossings
    assert arena.bytes_uploaded == stream.last.total_bytes + skipped  # the warm refill itself crossed once


def test_staging_is_two_layer_sized_reservations(parts) -> None:
    _, _, store = parts
    arena = EmulatedDeviceArena(DeviceBudget(GIB))
    stream = PrefillStream(store, arena)
    stream.open()
    assert arena.budget.held == {"prefill staging A": store.max_layer_bytes, "prefill staging B": store.max_layer_bytes}
    stream.close()
    assert arena.budget.used_bytes == 0


def test_cancelled_layer_major_prompt_keeps_nothing(parts) -> None:
    cfg, weights, store = parts
    stream = PrefillStream(store, EmulatedDeviceArena(DeviceBudget(GIB)))
    stream.open()
    model = MoETransformer(cfg, weights, NumpyOps())
    kv = model.new_kv_cache(N_CTX)
    asked = iter([False, False, True])
    assert stream_prompt(model, stream, list(range(20)), kv, "layer_major", 8, cancelled=lambda: next(asked)) is None
    assert kv.n_tokens == 0


def test_token_groups_gather_consecutive_chunks_and_leave_small_ones_alone() -> None:
    from runner.models.transformer import token_groups

    assert token_groups([16, 16, 16], 0) == [[0], [1], [2]]
    assert token_groups([16, 16, 16, 16, 5], 40) == [[0, 1], [2, 3], [4]]
    assert token_groups([2048] * 8 + [100], 16384) == [list(range(8)), [8]]
    assert token_groups([20, 8, 20], 100) == [[0], [1], [2]]  # an 8-row batch takes the small-batch kernels
    assert token_groups([100], 50) == [[0]]


def test_grouped_layer_major_stays_close_and_streams_the_set_once(parts) -> None:
    tokens = list(range(300, 340))
    per_chunk, _, _, _ = _run(parts, tokens, "layer_major", 10, all_logits=True)
    grouped, _, stream, arena = _run(parts, tokens, "layer_major", 10, all_logits=True, group_tokens=40)
    for x, y in zip(per_chunk, grouped):
        np.testing.assert_allclose(y, x, rtol=0, atol=2e-4 * np.abs(x).max())
    assert stream.last.total_bytes == arena.bytes_uploaded == _trunk_set_bytes(parts)


@pytest.mark.parametrize("prefix", [0, 7])
def test_a_grouped_layer_attends_once_per_group_after_storing_the_groups_keys(parts, prefix: int) -> None:
    """Layer-major with feed-forward groups: attention runs once per group and layer over the group's rows (its
    K/V written first, each row masked causally), not once per micro-batch, also when the prompt follows a
    cached prefix; the K/V equal the per-chunk run's to rounding, and so do the logits."""
    cfg, weights, _ = parts
    runs = []
    for group_tokens in (0, 20):
        model = MoETransformer(cfg, weights, NumpyOps())
        kv = model.new_kv_cache(N_CTX)
        if prefix:
            model.forward(np.arange(200, 200 + prefix), kv)
        calls = []
        attention = model.ops.attention

        def counted(q, k, v, positions, step, calls=calls, attention=attention):
            calls.append((len(positions), len(k)))
            return attention(q, k, v, positions, step)

        model.ops.attention = counted
        chunks = [np.arange(300 + s, 310 + s) for s in range(0, 40, 10)]
        out = model.forward_layer_major(chunks, kv, all_logits=True, group_tokens=group_tokens)
        runs.append(([logits for logits, _ in out], kv, calls))
    (per_chunk, kv_chunks, chunk_calls), (grouped, kv, calls) = runs
    assert chunk_calls == [(10, prefix + n) for n in (10, 20, 30, 40)] * cfg.n_layer
    assert calls == [(20, prefix + 20), (20, prefix + 40)] * cfg.n_layer  # two groups of two chunks, per layer
    assert kv.n_tokens == kv_chunks.n_tokens == prefix + 40
    for got, want in zip(grouped, per_chunk):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
    for layer in range(cfg.n_layer):
        want_k = kv_chunks.k[layer][: prefix + 40].astype(np.float32)  # f16: a rounding may land one step over
        got_k = kv.k[layer][: prefix + 40].astype(np.float32)
        np.testing.assert_allclose(got_k, want_k, rtol=0, atol=2**-10 * np.abs(want_k).max())
    if not prefix:  # the streamed layer-major run is this per-chunk run, bit for bit
        streamed = _run(parts, list(range(300, 340)), "layer_major", 10, all_logits=True)[0]
        assert all(np.array_equal(a, b) for a, b in zip(per_chunk, streamed))


def test_fetch_addresses_are_the_pointers_of_fetchs_views_staged_or_held(parts) -> None:
    cfg, weights, store = parts
    arena = EmulatedDeviceArena(DeviceBudget(GIB))
    cache = ExpertSlotCache(store, arena, 3)
    cache.release()
    cache.restore({1: [0, 3, 5]})
    stream = PrefillStream(store, arena, cache)
    stream.open()
    stream.begin([1, 2])
    stream.enter(1)
    w = weights.layers[1].ffn
    wanted = [5, 1, 3, 6]
    table = stream.fetch_addresses(w, wanted)
    views = stream.fetch(w, wanted)
    for e in range(store.n_expert(1)):
        want = [views[e].gate.ctypes.data, views[e].up.ctypes.data, views[e].down.ctypes.data] if e in views else [0, 0, 0]
        assert table[:, e].tolist() == want
    assert stream.recent[1][:4] == wanted
    stream.leave(1)
    with pytest.raises(CacheError, match="outside its prefill visit"):
        stream.fetch_addresses(weights.layers[2].ffn, [0])
    stream.end()


@pytest.mark.parametrize("order", ["per_microbatch", "layer_major"])
def test_the_stream_counts_the_distinct_experts_a_prompt_routed_to_per_layer(parts, order, monkeypatch) -> None:
    """StreamCounters.routed: per layer, the distinct experts any chunk of the prompt asked for (what a stream
    of only the used experts would move); one token routes to exactly its top-k."""
    cfg, _, _ = parts
    asked: dict[int, set[int]] = {}
    fetch = PrefillStream.fetch

    def recording(self, w, experts):
        asked.setdefault(self._plan[self._next - 1], set()).update(int(e) for e in experts)
        return fetch(self, w, experts)

    monkeypatch.setattr(PrefillStream, "fetch", recording)
    _, _, one, _ = _run(parts, [123], order, 4)
    assert set(one.last.routed.values()) == {cfg.n_expert_used}
    asked.clear()
    _, _, stream, _ = _run(parts, list(range(400, 437)), order, 8)
    assert stream.last.routed == {layer: len(ids) for layer, ids in asked.items()}
    assert all(cfg.n_expert_used < n <= cfg.n_expert for n in stream.last.routed.values())
    assert stream.last.to_dict(1)["routed_experts"] == sum(stream.last.routed.values())
