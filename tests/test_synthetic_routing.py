"""Synthetic routing with locality (runner/offload/locality_routing.py, synthetic_routing.py): the process,
its calibration against measured LRU hit rates, the ids override end to end on numpy, and the bench label."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from runner.backends.budget import GIB, DeviceBudget
from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.gguf_file import open_gguf
from runner.models.config import model_config
from runner.models.weights import MoEWeights, load_weights
from runner.offload.device_arena import EmulatedDeviceArena
from runner.offload.host_store import HostExpertStore
from runner.offload.locality_routing import (
    PRESETS,
    LocalityProcess,
    RoutingError,
    calibrate,
    lru_hit_rate,
    simulated_hit_rates,
)
from runner.offload.provider import ExpertMatrices, ResidentExperts, experts_by_recency, moe_layer_index
from runner.offload.slot_cache import ExpertSlotCache
from runner.offload.synthetic_routing import RoutingMode, SyntheticRouting, attach, uniform_ids

TOLERANCE = 0.04  # absolute hit rate, at every target point, at the calibration seed
OTHER_SEEDS_TOLERANCE = 0.05  # the same process drawn with other seeds


def test_the_process_is_deterministic_per_seed() -> None:
    p = LocalityProcess(tau=4.0, novelty=0.05, zipf_s=0.8, seed=3)
    a, b = p.generate(64, 6, 200, 3), p.generate(64, 6, 200, 3)
    assert a.dtype == np.int32 and a.shape == (3, 200, 6)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, dataclasses.replace(p, seed=4).generate(64, 6, 200, 3))


def test_each_position_routes_to_k_distinct_experts_of_the_layer() -> None:
    ids = LocalityProcess(tau=2.0, novelty=0.01, zipf_s=1.5).generate(16, 4, 300, 2)
    assert ids.min() >= 0 and ids.max() < 16
    assert all(len(set(row)) == 4 for row in ids.reshape(-1, 4).tolist())


def test_locality_raises_hit_rates_above_uniform_routing() -> None:
    uniform = np.array([np.random.default_rng(t).choice(128, 8, replace=False) for t in range(256)])
    local = LocalityProcess(tau=5.0, novelty=0.13, zipf_s=1.2).generate(128, 8, 256, 1)[0]
    assert abs(lru_hit_rate(uniform, 32, 128) - 0.25) < 0.05  # about slots / n_expert, less the cold start
    assert lru_hit_rate(local, 32, 128) > lru_hit_rate(uniform, 32, 128) + 0.3


def test_the_simulated_lru_counts_what_the_slot_cache_counts(synth_model) -> None:
    f = open_gguf(synth_model("glm4moe", "Q8_0"))
    store = HostExpertStore(load_weights(f, model_config(f)))
    ids = LocalityProcess(tau=3.0, novelty=0.1, zipf_s=0.5).generate(store.n_expert(1), 2, 120, 1)[0]
    for slots in (2, 3, 5):
        cache = ExpertSlotCache(store, EmulatedDeviceArena(DeviceBudget(GIB)), slots, "lru")
        for row in ids:
            cache.fetch(store.weights(1), experts_by_recency(row[None]))
        assert lru_hit_rate(ids, slots, store.n_expert(1)) == cache.counters[1].hit_rate


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_calibrated_preset_meets_its_hit_rates_on_its_own_shape(preset: str) -> None:
    target = PRESETS[preset]
    c = calibrate(preset, target.n_expert, target.k)
    assert [s for s, _, _ in c.points] == [s for s, _ in target.points]
    assert c.max_error <= TOLERANCE, c.points
    for seed in (1, 2):
        got = simulated_hit_rates(dataclasses.replace(c.process, seed=seed), target.n_expert, target.k, c.tokens,
                                  [s for s, _ in target.points])
        assert max(abs(g - h) for g, (_, h) in zip(got, target.points)) <= OTHER_SEEDS_TOLERANCE, got


def test_another_shape_is_calibrated_at_the_same_fraction_of_its_experts() -> None:
    target = PRESETS["qwen3-30b-a3b"]  # 8 / 24 / 49 / 81 of 128 experts, top-8, 256 tokens
    assert target.scaled_points(512, 10) == ((32, 0.366), (96, 0.741), (196, 0.894), (324, 0.962))
    assert target.scaled_tokens(512, 10) == 819  # as many uses per expert
    assert target.scaled_points(16, 2)[0] == (2, 0.366)  # never fewer slots than a token's experts


def test_routing_flags_parse_and_name_their_choices() -> None:
    assert not RoutingMode.parse("random").synthetic and RoutingMode.parse("random").label == "random"
    assert RoutingMode.parse("locality-demo", seed=2) == RoutingMode("locality-demo", 2)
    assert RoutingMode.parse("uniform").synthetic
    with pytest.raises(RoutingError, match="choose from random, uniform, locality-qwen3-30b-a3b, locality-demo"):
        RoutingMode.parse("locality-mixtral")
    with pytest.raises(RoutingError, match="unknown routing 'demo'"):
        RoutingMode.parse("demo")


def test_uniform_routing_has_distinct_ids_and_no_locality() -> None:
    ids = uniform_ids(128, 8, 400, 2, seed=1)
    assert np.array_equal(ids, uniform_ids(128, 8, 400, 2, seed=1)) and ids.dtype == np.int32
    assert all(len(set(row)) == 8 for row in ids.reshape(-1, 8).tolist())
    assert abs(lru_hit_rate(ids[0], 32, 128, count_from=100) - 32 / 128) < 0.03  # slots / n_expert, warm


def test_ids_for_replaces_ids_by_layer_and_position_and_keeps_their_type() -> None:
    routing = SyntheticRouting.for_shape(RoutingMode.parse("locality-demo"), 16, 2, layers=[1, 3], n_positions=40)
    router_ids = np.array([[0, 1], [2, 3], [4, 5]], dtype=np.int64)
    got = routing.ids_for(3, router_ids, np.array([7, 8, 9]))
    assert got.dtype == np.int64 and np.array_equal(got, routing._host[3][7:10])
    assert not np.array_equal(routing.ids_for(1, router_ids, np.array([7, 8, 9])), got)  # layers differ
    assert routing.lookups == 2
    with pytest.raises(RoutingError, match="outside the synthetic routing table of 40 positions"):
        routing.ids_for(1, router_ids, np.array([38, 39, 40]))
    with pytest.raises(RoutingError, match="layer 2 has no synthetic routing table"):
        routing.ids_for(2, router_ids, np.array([0, 1, 2]))
    with pytest.raises(RoutingError, match=r"the router gave ids \(3, 3\)"):
        routing.ids_for(1, np.zeros((3, 3), dtype=np.int64), np.array([0, 1, 2]))


def test_a_routing_nobody_asked_is_an_error_not_a_silent_random_run() -> None:
    routing = SyntheticRouting.for_shape(RoutingMode.parse("uniform"), 16, 2, layers=[1], n_positions=8)
    with pytest.raises(RoutingError, match="no routing hook"):
        routing.require_used()


class _Recorder:
    """Resident experts, recording each fetch's experts per MoE layer."""

    def __init__(self) -> None:
        self.inner, self.seen = ResidentExperts(), defaultdict(list)

    def fetch(self, w: MoEWeights, experts: Sequence[int]) -> Mapping[int, ExpertMatrices]:
        self.seen[moe_layer_index(w)].append(sorted(experts))
        return self.inner.fetch(w, experts)


def _decode_experts(synth_model, mode: RoutingMode) -> tuple[dict, SyntheticRouting | None, list[int]]:
    recorder = _Recorder()
    engine = Engine.load(synth_model("glm4moe"), EngineConfig(n_ctx=64, ubatch=4), experts=recorder)
    routing = attach(engine, mode)
    prompt = [5, 9, 13, 2, 77, 31]
    gen = engine.generate(prompt, 8, SamplingParams(temperature=0.0), ignore_eos=True)
    recorder.seen.clear()
    list(gen.steps())  # the generator runs prefill at its first step: recorded decode steps follow
    return {layer: seen[-7:] for layer, seen in recorder.seen.items()}, routing, prompt


def test_the_override_changes_the_experts_a_forward_uses_end_to_end(synth_model) -> None:
    router, none, prompt = _decode_experts(synth_model, RoutingMode.parse("random"))
    synthetic, routing, _ = _decode_experts(synth_model, RoutingMode.parse("locality-demo"))
    assert none is None and routing is not None
    routing.require_used()
    first = len(prompt)  # the 7 decode steps feed generated tokens 1..7, at these positions
    for layer, steps in synthetic.items():
        want = [sorted(routing._host[layer][p].tolist()) for p in range(first, first + 7)]
        assert steps == want
    assert synthetic != router  # the random file's router would not have picked these


def test_bench_offload_decode_labels_synthetic_routing_in_its_record(synth_model, tmp_path, monkeypatch) -> None:
    from scripts.bench import bench_offload

    records = {}
    for routing in ("random", "locality-qwen3-30b-a3b"):
        out = tmp_path / f"{routing}.json"
        monkeypatch.setattr(sys, "argv", [
            "bench_offload", "decode", str(synth_model("glm4moe")), "--backend", "numpy", "--slots", "4",
            "--contexts", "16", "--tokens", "6", "--runs", "1", "--vram-budget", "1", "--ubatch", "16",
            "--server-ubatch", "16", "--routing", routing, "--out", str(out)])
        bench_offload.main()
        records[routing] = json.loads(out.read_text())
    assert records["random"]["routing"]["mode"] == "random" and not records["random"]["routing"]["synthetic"]
    label = records["locality-qwen3-30b-a3b"]["routing"]
    assert label["synthetic"] and label["mode"] == "locality-qwen3-30b-a3b" and "SYNTHETIC" in label["note"]
    assert label["lookups"] > 0 and label["parameters"]["n_expert"] == 8 and label["parameters"]["tau"] > 0
    assert records["locality-qwen3-30b-a3b"]["benchmark"] == "offload_decode (synthetic routing: locality-qwen3-30b-a3b)"


def test_runner_profile_names_its_routing_in_the_report(synth_model, tmp_path) -> None:
    from click.testing import CliRunner

    from runner.cli.main import main

    prompt = tmp_path / "p.txt"
    prompt.write_text("Routed experts live in host memory and stream to the card layer by layer. ")
    reports = {}
    for routing in ("random", "locality-demo"):
        out = tmp_path / f"{routing}.json"
        result = CliRunner().invoke(main, ["profile", str(synth_model("glm4moe")), "--prompt-file", str(prompt),
                                           "--prompt-tokens", "24", "--gen", "4", "--cache-slots", "4", "--backend",
                                           "numpy", "--routing", routing, "--json", str(out)])
        assert result.exit_code == 0, result.output
        reports[routing] = json.loads(out.read_text())["routing"]
    assert reports["random"]["mode"] == "random" and not reports["random"]["synthetic"]
    assert reports["locality-demo"]["synthetic"] and reports["locality-demo"]["lookups"] > 0
    bad = CliRunner().invoke(main, ["profile", str(synth_model("glm4moe")), "--prompt-file", str(prompt),
                                    "--backend", "numpy", "--routing", "locality-nope"])
    assert bad.exit_code != 0 and "choose from random, uniform, locality-qwen3-30b-a3b, locality-demo" in bad.output
