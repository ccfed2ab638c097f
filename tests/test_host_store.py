"""The host expert store: per-expert [gate | up | down] layout, sizes, progress, and pinning reports."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

from runner.cli.info import model_info
from runner.engine.engine import Engine, EngineConfig
from runner.errors import CacheError
from runner.gguf_file import TensorInfo, open_gguf
from runner.models.config import model_config
from runner.models.weights import MoEWeights, load_weights
from runner.offload import host_store
from runner.offload.host_store import MATRIX_ALIGN, ExpertLayout, HostExpertStore
from runner.offload.provider import raw_expert


def _weights(path):
    f = open_gguf(path)
    return f, load_weights(f, model_config(f))


@pytest.mark.parametrize("quant", ["F32", "Q8_0"])
def test_each_expert_is_one_contiguous_gate_up_down_copy_of_the_file(synth_model, quant) -> None:
    _, weights = _weights(synth_model("glm4moe", quant))
    store = HostExpertStore(weights)
    assert store.layers == (1, 2, 3)  # two MoE trunk layers and the NextN block; blk.0 is dense
    for layer in store.layers:
        w = store.weights(layer)
        for e in (0, 5, 7):
            expected = np.concatenate([raw_expert(t, e).reshape(-1) for t in (w.gate_exps, w.up_exps, w.down_exps)])
            assert np.array_equal(store.experts(layer, e), expected)
        assert np.array_equal(store.experts(layer, 0, store.n_expert(layer)), store.layer_range(layer))


def test_sizes_agree_with_runner_info(synth_model) -> None:
    f, weights = _weights(synth_model("qwen3moe", "Q8_0"))
    info, store = model_info(f), HostExpertStore(weights)
    assert store.expert_set_bytes == info.routed_expert_bytes == store.arena.nbytes
    assert {i: store.layer_bytes(i) for i in store.layers} == info.routed_expert_bytes_per_layer
    assert max(store.expert_bytes(i) for i in store.layers) == info.expert_slot_bytes


def test_progress_reports_bytes_done_up_to_the_total(synth_model) -> None:
    _, weights = _weights(synth_model("glm4moe"))
    seen: list[tuple[int, int]] = []
    store = HostExpertStore(weights, progress=lambda done, total: seen.append((done, total)))
    assert seen[0] == (0, store.expert_set_bytes) and seen[-1] == (store.expert_set_bytes,) * 2
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and len(seen) == 1 + 3 * len(store.layers)


def test_failed_pinning_falls_back_to_pageable_and_says_what_it_costs(synth_model, caplog) -> None:
    _, weights = _weights(synth_model("glm4moe"))

    def no_pinning(array: np.ndarray) -> Callable[[], None]:
        raise MemoryError("cudaHostRegister: out of locked memory")

    with caplog.at_level(logging.WARNING):
        store = HostExpertStore(weights, pin_host=no_pinning)
    assert not store.pinned
    assert "out of locked memory" in store.pin_note and "6-12 GB/s" in store.pin_note and "55 GB/s" in store.pin_note
    assert store.pin_note in caplog.text
    with pytest.raises(CacheError, match="not pinned"):
        HostExpertStore(weights, pin_host=no_pinning, require_pinned=True)


def test_a_store_larger_than_the_available_ram_is_refused_in_one_line_before_any_page_is_filled(
        synth_model, monkeypatch) -> None:
    _, weights = _weights(synth_model("glm4moe"))
    need = HostExpertStore(weights).expert_set_bytes
    seen: list[int] = []
    monkeypatch.setattr(host_store, "available_host_bytes", lambda: need - 1)
    with pytest.raises(CacheError, match=r"needs [\d.]+ [KMG]iB of RAM .* only [\d.]+ [KMG]iB is available") as err:
        HostExpertStore(weights, progress=lambda done, total: seen.append(done))
    assert "\n" not in str(err.value) and seen == [0]  # nothing copied
    monkeypatch.setattr(host_store, "available_host_bytes", lambda: need)
    assert HostExpertStore(weights).expert_set_bytes == need


def test_the_filled_arena_is_pinned_in_place_and_unpinned_when_the_store_goes(synth_model) -> None:
    _, weights = _weights(synth_model("glm4moe"))
    pinned: dict[int, bytes] = {}  # address -> the bytes there when pinned

    def pin(array: np.ndarray) -> Callable[[], None]:
        address = array.ctypes.data
        pinned[address] = array.tobytes()
        return lambda: pinned.pop(address)

    store = HostExpertStore(weights, pin_host=pin)
    assert store.pinned and store.pin_note is None and set(pinned) == {store.arena.ctypes.data}
    assert pinned[store.arena.ctypes.data] == store.arena.tobytes()  # pinned after the fill, whole
    assert store.arena.any() and set(store.load_seconds) == {"fill_s", "pin_s"}
    del store
    gc.collect()
    assert pinned == {}


def test_greedy_output_served_from_the_host_store_equals_the_file(synth_model) -> None:
    path = synth_model("glm4moe", "Q8_0")
    tokens = list(range(30, 50))
    plain = Engine.load(path, EngineConfig(n_ctx=64)).logits_all(tokens)
    _, weights = _weights(path)
    hosted = Engine.load(path, EngineConfig(n_ctx=64), experts=HostExpertStore(weights))
    assert np.array_equal(plain, hosted.logits_all(tokens))


def test_expert_layout_starts_every_matrix_on_a_16_byte_boundary() -> None:
    """Q8_0 rows of 32 values are 34 bytes: 3 rows leave a matrix 102 bytes long, so the next one is
    padded to 112 (the GEMV kernels load 16 bytes at a time from 16-byte aligned types)."""
    def q8(name: str, rows: int) -> TensorInfo:
        return TensorInfo(name, QT.Q8_0, (2, rows, 32), np.zeros((2, rows, 34), dtype=np.uint8), 0)

    w = MoEWeights(router=None, probs_bias=None, gate_exps=q8("blk.1.ffn_gate_exps.weight", 3),
                   up_exps=q8("blk.1.ffn_up_exps.weight", 3), down_exps=q8("blk.1.ffn_down_exps.weight", 5),
                   shared=None)
    lay = ExpertLayout.of(w)
    assert (lay.gate.offset, lay.up.offset, lay.down.offset) == (0, 112, 224)
    assert lay.down.nbytes == 170 and lay.expert_bytes == 400 and lay.expert_bytes % MATRIX_ALIGN == 0
