"""The stream timeline: spans as recorded, and the prefill stream's copy and compute spans per layer visit."""

from __future__ import annotations

import math

import pytest

from runner.backends.budget import GIB, DeviceBudget
from runner.backends.numpy.ops import NumpyOps
from runner.gguf_file import open_gguf
from runner.models import MoETransformer
from runner.models.config import model_config
from runner.models.weights import load_weights
from runner.offload.device_arena import EmulatedDeviceArena
from runner.offload.host_store import HostExpertStore
from runner.offload.prefill_stream import PrefillStream, stream_prompt
from runner.offload.timeline import Timeline, WallClock


def test_spans_come_back_in_start_order_with_their_stream_layer_and_label() -> None:
    tl = Timeline(WallClock())
    a = tl.start("copy", 1, "visit 0")
    b = tl.start("compute", 0, "dense")
    tl.stop(b)
    tl.stop(a)
    tl.start("compute", 2)  # never stopped: left out
    spans = tl.spans()
    assert [(s.stream, s.layer, s.label) for s in spans] == [("copy", 1, "visit 0"), ("compute", 0, "dense")]
    assert spans[0].start_s <= spans[1].start_s <= spans[1].end_s <= spans[0].end_s
    assert not tl.clock.gpu and "not GPU timings" in tl.clock.name
    with pytest.raises(ValueError, match="already stopped"):
        tl.stop(a)
    with pytest.raises(ValueError, match="unknown stream 'dma'"):
        tl.start("dma", 0)


@pytest.fixture(scope="module")
def parts(synth_model):
    f = open_gguf(synth_model("glm4moe", "Q8_0"))
    cfg = model_config(f)
    weights = load_weights(f, cfg)
    return cfg, weights, HostExpertStore(weights)


def _stream(parts, order: str, n_tokens: int, ubatch: int) -> tuple[list, list[int]]:
    cfg, weights, store = parts
    stream = PrefillStream(store, EmulatedDeviceArena(DeviceBudget(GIB)))
    stream.timeline = Timeline()
    stream.open()
    model = MoETransformer(cfg, weights, NumpyOps())
    stream_prompt(model, stream, list(range(10, 10 + n_tokens)), model.new_kv_cache(64), order, ubatch)
    return stream.timeline.spans(), [i for i in store.layers if i < cfg.n_layer]


@pytest.mark.parametrize("order", ["layer_major", "per_microbatch"])
def test_the_prefill_stream_records_a_copy_span_per_visit_and_a_compute_span_per_layer_pass(parts, order) -> None:
    n_tokens, ubatch = 20, 8
    spans, moe_layers = _stream(parts, order, n_tokens, ubatch)
    cfg = parts[0]
    passes = 1 if order == "layer_major" else math.ceil(n_tokens / ubatch)
    copies = [s for s in spans if s.stream == "copy"]
    computes = [s for s in spans if s.stream == "compute"]
    assert [s.layer for s in copies] == moe_layers * passes  # one upload per visit, in schedule order
    assert [s.layer for s in computes] == list(range(cfg.n_layer)) * passes  # dense layers too
    assert [s.label for s in computes if s.layer == 0] == ["dense"] * passes
    assert all(s.end_s >= s.start_s >= 0 for s in spans)
    # Every MoE layer's pass waits for its visit's uploads once per fetch, inside its compute span.
    waits = [s for s in spans if s.stream == "wait"]
    assert {(s.layer, s.label) for s in waits} == {(s.layer, s.label) for s in computes if s.label != "dense"}
    for w in waits:
        assert any(c.layer == w.layer and c.label == w.label and c.start_s <= w.start_s <= w.end_s <= c.end_s
                   for c in computes)
    # Wall clock: visit k's upload finished before its layer's compute started (the fence), and visit
    # k+1's prefetch ran at the same enter(), before that compute too.
    for copy in copies:
        k = int(copy.label.split()[1])
        compute = next(s for s in computes if s.label == f"visit {max(k - 1, 0)}")
        assert copy.end_s <= compute.start_s
