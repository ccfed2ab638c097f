"""Expert offload on the CUDA backend: the copy-stream arena, gathered dequantization, and the engine
with routed experts in pinned host memory giving the all-resident CUDA path's greedy tokens.

Fresh models (seeds 81..83) no other test uses; quantized files carry random blocks (synth `direct=True`).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize as dequantize_numpy

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.budget import GIB, DeviceBudget  # noqa: E402
from runner.backends.cuda.dequant import dequantize_gather  # noqa: E402
from runner.backends.cuda.expert_arena import CudaDeviceArena, pin_in_place, pinned_host  # noqa: E402
from runner.backends.cuda.ops import CudaOps  # noqa: E402
from runner.engine.engine import Engine, EngineConfig  # noqa: E402
from runner.engine.sampling import SamplingParams  # noqa: E402
from runner.gguf_file import open_gguf  # noqa: E402
from runner.models.config import model_config  # noqa: E402
from runner.models.weights import load_weights  # noqa: E402
from runner.offload.host_store import ExpertLayout, HostExpertStore, MatrixLayout  # noqa: E402
from runner.offload.offload import OffloadConfig  # noqa: E402
from runner.offload.provider import MATRICES, experts_by_recency  # noqa: E402
from runner.offload.slot_cache import ExpertSlotCache  # noqa: E402
from runner.synth.random_blocks import random_tensor  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
UBATCH = 16


def test_arena_uploads_from_pinned_memory_and_views_the_bytes() -> None:
    budget = DeviceBudget(1 << 24)
    arena = CudaDeviceArena(budget)
    host = pinned_host(3000)
    host.array[:] = np.arange(3000) % 251
    region = arena.reserve("slots", 4096)
    assert budget.held["slots"] == 4096
    arena.upload(region, 1024, host.array[:3000])
    arena.wait(arena.fence())
    layout = ExpertLayout(MatrixLayout(QT.F32, 10, 40, 0), MatrixLayout(QT.F32, 10, 40, 400),
                          MatrixLayout(QT.F32, 10, 40, 800))
    m = arena.view(region, 1024, layout)
    assert np.array_equal(cp.asnumpy(m.up).reshape(-1), host.array[400:800])
    assert host.pinned and arena.bytes_uploaded == 3000
    arena.free(region)
    assert "slots" not in budget.held
    with pytest.raises(ValueError):
        arena.upload(region, 0, host.array[:10])


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_K, QT.Q6_K, QT.IQ4_XS, QT.Q5_0])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_gathered_dequantize_equals_dequantizing_each_expert(qtype: QT, dtype) -> None:
    rng = np.random.default_rng(int(qtype))
    data = random_tensor(rng, qtype, (5, 7, 512), std=0.05)  # 5 experts of 7 rows
    raw = cp.asarray(np.ascontiguousarray(data).view(np.uint8).reshape(5, -1))
    order = np.array([3, 0, 4, 3])  # any order, repeats allowed
    ptrs = cp.asarray(np.array([raw[e].data.ptr for e in order], dtype=np.uint64))
    got = cp.asnumpy(dequantize_gather(ptrs, qtype, 7, 512, dtype))
    want = dequantize_numpy(data, qtype).reshape(5, 7, 512)[order].astype(dtype)
    assert got.shape == (4, 7, 512) and np.array_equal(got, want)


@pytest.fixture(scope="module", params=[("glm4moe", "Q4_K_M", 81), ("qwen3moe", "Q8_0", 82), ("glm4moe", "F32", 83)])
def model(request, synth_model):
    arch, quant, seed = request.param
    path = synth_model(arch, quant, seed=seed, direct=quant != "F32")
    prompt = [int(t) for t in np.random.default_rng(seed).integers(3, 500, size=40)]
    return path, prompt, {}


def _resident_tokens(model, ubatch: int) -> list[int]:
    """The all-resident CUDA path's greedy tokens with prompts in `ubatch`-token forwards (cached).

    The batch size picks the kernels (GEMV up to 8 rows, fp16 GEMM beyond), so a prompt run
    through the cache in small batches is compared with the resident path at the same size.
    """
    path, prompt, cache = model
    if ubatch not in cache:
        resident = Engine.load(path, EngineConfig(n_ctx=256, ubatch=ubatch), ops=CudaOps())
        cache[ubatch] = resident.generate(prompt, 40, GREEDY, ignore_eos=True).run().tokens
    return cache[ubatch]


def _offloaded(path, budget_bytes: int = 2 * GIB, **offload) -> Engine:
    cfg = OffloadConfig(**{"cache_slots": 3, "prefill_ubatch": UBATCH, "transaction": "always", **offload})
    return Engine.load(path, EngineConfig(n_ctx=256, ubatch=UBATCH, offload=cfg), ops=CudaOps(DeviceBudget(budget_bytes)))


@pytest.mark.parametrize("order,transaction", [("layer_major", "always"), ("per_microbatch", "always"),
                                               ("layer_major", "never")])
def test_offloaded_greedy_tokens_equal_the_all_resident_cuda_path(model, order: str, transaction: str) -> None:
    path, prompt, _ = model
    engine = _offloaded(path, prefill_order=order, transaction=transaction)
    through_cache = engine.offload.cache_batch(UBATCH)  # its batch size
    expected = _resident_tokens(model, UBATCH if transaction == "always" else through_cache)
    assert len(set(expected)) > 8
    assert engine.offload.store.pinned
    assert engine.generate(prompt, 40, GREEDY, ignore_eos=True).run().tokens == expected
    s = engine.stats()
    assert s["cache"]["total"]["misses"] > 0 and s["cache"]["total"]["evictions"] > 0
    assert s["healthy"] and s["budget"]["peak_bytes"] <= s["budget"]["limit_bytes"]
    if transaction == "always":
        crossings = 1 if order == "layer_major" else -(-len(prompt) // UBATCH)
        assert s["prefill"]["last_prompt"]["bytes"] == crossings * s["prefill"]["expert_set_bytes"]
        assert s["phase"]["begins"] == s["phase"]["ends"] == 1


def test_no_routed_expert_is_uploaded_whole_under_offload(model) -> None:
    path, _, _ = model
    engine = _offloaded(path)
    names = list(engine.ops.weights._tensors)
    assert names and not any("_exps" in n for n in names)


def test_the_store_is_pinned_in_place_mapped_at_its_host_address_and_unpinned_when_dropped(model) -> None:
    path, _, _ = model
    f = open_gguf(path)
    store = HostExpertStore(load_weights(f, model_config(f)), pin_in_place, require_pinned=True)
    arena = store.arena
    attrs = cp.cuda.runtime.pointerGetAttributes(arena.ctypes.data + arena.nbytes // 2)
    assert store.pinned and attrs.devicePointer == arena.ctypes.data + arena.nbytes // 2
    device = cp.empty(arena.nbytes, dtype=cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.runtime.memcpyAsync(device.data.ptr, arena.ctypes.data, arena.nbytes, 1, stream.ptr)
    stream.synchronize()
    assert np.array_equal(cp.asnumpy(device), arena)
    del store
    gc.collect()
    pin_in_place(arena)()  # registering the pages again succeeds only if the store's registration is gone


def test_pair_address_tables_equal_the_views_data_ptr_after_hits_misses_and_evictions(model) -> None:
    path, _, _ = model
    f = open_gguf(path)
    store = HostExpertStore(load_weights(f, model_config(f)), pin_in_place)
    cache = ExpertSlotCache(store, CudaDeviceArena(DeviceBudget(2 * GIB)), 3)  # the pool limit _offloaded sets
    layer, n_expert = store.layers[0], store.n_expert(store.layers[0])
    rng = np.random.default_rng(5)
    for _ in range(40):
        ids = rng.choice(n_expert, 3, replace=False).astype(np.int32).reshape(1, 3)
        table = cache.fetch_pair_addresses(store.weights(layer), ids, np.zeros((3, 3), dtype=np.uint64))
        views = cache.fetch(store.weights(layer), experts_by_recency(ids))  # all hits now
        for p, e in enumerate(ids[0].tolist()):
            assert [int(table[r, p]) for r in range(3)] == [getattr(views[e], m).data.ptr for m in MATRICES]
            assert np.array_equal(cp.asnumpy(views[e].gate), store.matrices(layer, e).gate)
    c = cache.counters[layer]
    assert c.evictions > 0 and c.hits >= 40 * 3


def test_arena_copies_experts_device_to_device_after_the_staging_upload() -> None:
    """Warm fill from staging: copy_experts on the compute stream, after it waited for the upload, reads what the
    upload wrote; in 16-byte words where sizes allow, else 4 or 1 (a Q6_K row is 210 bytes)."""
    arena = CudaDeviceArena(DeviceBudget(1 << 24))
    for size in (1024, 1000, 1050):
        host = pinned_host(4 * size)
        host.array[:] = np.arange(4 * size) % 253
        staging, slots = arena.reserve("staging", 4 * size), arena.reserve("slots", 3 * size)
        slots.memory.fill(0)  # the slot between the two copied ones must stay 0: no run overruns its end
        copied = arena.bytes_copied
        arena.upload(staging, 0, host.array)
        arena.wait(arena.fence())
        arena.copy_experts(slots, [0, 2 * size], staging, [3 * size, size], size)  # expert 3 to slot 0, 1 to slot 2
        got = cp.asnumpy(slots.memory)
        assert np.array_equal(got[:size], host.array[3 * size:]) and not got[size:2 * size].any()
        assert np.array_equal(got[2 * size:], host.array[size:2 * size])
        assert arena.bytes_copied - copied == 2 * size
        arena.free(staging)
        arena.free(slots)
    staging, slots = arena.reserve("staging", 4000), arena.reserve("slots", 2000)
    with pytest.raises(ValueError):
        arena.copy_experts(slots, [1500], staging, [0], 1000)  # overruns the slots


@pytest.mark.parametrize("order", ["layer_major", "per_microbatch"])
def test_warm_fill_from_staging_gives_the_host_restores_slots_and_tokens(model, order: str) -> None:
    path, prompt, _ = model
    host, staged = _offloaded(path, prefill_order=order), _offloaded(path, prefill_order=order, warm_fill="staging")
    tokens = host.generate(prompt, 40, GREEDY, ignore_eos=True).run().tokens
    host.reset()
    host_warm_before = host.stats()["cache"]["total"]["warm_bytes"]  # the generation's own restore
    host.prefill(prompt)
    staged.prefill(prompt)
    for i in host.offload.store.layers:
        assert list(staged.offload.cache._layers[i].policy._order) == list(host.offload.cache._layers[i].policy._order)
    s = staged.stats()
    assert s["prefill"]["warm_fill"]["staged"] == 1, s["prefill"]["warm_fill"]
    assert s["cache"]["total"]["warm_bytes"] == 0
    host_warm = host.stats()["cache"]["total"]["warm_bytes"] - host_warm_before
    assert s["cache"]["total"]["warm_device_bytes"] == host_warm > 0
    staged.reset()
    assert staged.generate(prompt, 40, GREEDY, ignore_eos=True).run().tokens == tokens
    assert staged.stats()["budget"]["peak_bytes"] <= staged.stats()["budget"]["limit_bytes"]


def test_a_partial_warm_fill_keeps_the_groups_that_fit_and_the_host_restores_tokens(model, monkeypatch) -> None:
    """The slot cache in groups of layers on the CUDA arena: when only the first group fits beside the prompt
    (decided by Offload._groups_within, forced here: on this backend the prompt's buffers dwarf a tiny model's
    slots, so no budget leaves room for one group and not the next; tests/test_warm_fill.py drives it by the
    budget on the CPU), that group's layers fill device to device, the others' warm experts cross from the
    host, and slots and greedy tokens stay the host restore's."""
    path, prompt, _ = model
    host, tight = _offloaded(path, prefill_order="layer_major"), _offloaded(path, warm_fill="staging")
    cache = tight.offload.cache
    assert len(cache.groups) >= 2
    monkeypatch.setattr(tight.offload, "_groups_within", lambda room: [0])
    tokens = host.generate(prompt, 40, GREEDY, ignore_eos=True).run().tokens
    assert tight.generate(prompt, 40, GREEDY, ignore_eos=True).run().tokens == tokens
    fill = tight.stats()["prefill"]["warm_fill"]
    assert (fill["staged"], fill["fallbacks"], fill["partial"]) == (1, 1, 1), fill
    first = set(cache.groups[0])
    c, h = cache.counters, host.offload.cache.counters
    for i in cache.store.layers:
        if i in first:
            assert c[i].warm_device_fills == h[i].warm_fills and c[i].warm_fills == 0, i
        else:
            assert c[i].warm_device_fills == 0 and c[i].warm_fills == h[i].warm_fills, i
    assert any(c[i].warm_device_fills for i in first)
    assert {i: list(cache._layers[i].policy._order) for i in cache.store.layers} == {
        i: list(host.offload.cache._layers[i].policy._order) for i in cache.store.layers}
    assert tight.stats()["budget"]["peak_bytes"] <= tight.stats()["budget"]["limit_bytes"]
