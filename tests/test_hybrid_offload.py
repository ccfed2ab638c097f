"""Expert offload with the hybrid families (numpy backend, emulated device budget): only the MoE half
streams, in either prefill order; the output is the all-resident engine's, and a layer-major prompt
cancelled between layers leaves no DeltaNet state behind."""

from __future__ import annotations

import numpy as np
import pytest

from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.offload.offload import OffloadConfig
from runner.spec.config import DraftConfig

GREEDY = SamplingParams(temperature=0.0)
UBATCH = 8
HYBRIDS = ["qwen35moe", "qwen3next"]


def _offloaded(path, **offload) -> Engine:
    cfg = OffloadConfig(**{"cache_slots": 3, "prefill_ubatch": UBATCH, "transaction": "always", **offload})
    return Engine.load(path, EngineConfig(n_ctx=128, ubatch=UBATCH, offload=cfg))


def _resident(path) -> Engine:
    return Engine.load(path, EngineConfig(n_ctx=128, ubatch=UBATCH))


@pytest.mark.parametrize("arch", HYBRIDS)
@pytest.mark.parametrize("order", ["layer_major", "per_microbatch"])
def test_greedy_output_and_logits_with_3_of_8_slots_equal_the_resident_engine_s(synth_model, arch: str,
                                                                               order: str) -> None:
    path = synth_model(arch, "Q8_0")
    resident = _resident(path)
    prompt = resident.tokenizer.encode("The expert cache must not change a single token of this reply")
    expected = resident.generate(prompt, 12, GREEDY, ignore_eos=True).run().tokens
    engine = _offloaded(path, prefill_order=order)
    assert engine.generate(prompt, 12, GREEDY, ignore_eos=True).run().tokens == expected
    stats = engine.stats()
    assert stats["cache"]["total"]["misses"] > 0 and stats["phase"]["begins"] == stats["phase"]["ends"] == 1
    tokens = list(range(50, 90))
    assert np.array_equal(engine.logits_all(tokens), resident.logits_all(tokens))


@pytest.mark.parametrize("arch", HYBRIDS)
def test_a_layer_major_prompt_cancelled_between_layers_keeps_no_delta_net_state(synth_model, arch: str) -> None:
    path = synth_model(arch, "Q8_0")
    engine = _offloaded(path)
    prompt = list(range(100, 130))
    engine.prefill(prompt[:10])
    asked = iter([False, False, True])  # layer-major: layers 0 and 1 run over the prompt, then it stops
    assert engine.prefill(prompt, cancelled=lambda: next(asked, True)) is None
    assert engine.kv.n_tokens == 10
    resident = _resident(path)
    np.testing.assert_array_equal(engine.prefill(prompt), resident.prefill(prompt))


@pytest.mark.parametrize("arch", HYBRIDS)
def test_greedy_mtp_under_offload_equals_plain_decoding(synth_model, arch: str) -> None:
    path = synth_model(arch, "Q8_0")
    prompt = list(range(200, 224))
    plain = _resident(path).generate(prompt, 24, GREEDY, ignore_eos=True).run().tokens
    engine = _offloaded(path, cache_slots=8, decode_batch=4)
    drafted = engine.generate(prompt, 24, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 3, adaptive=False)).run()
    assert drafted.tokens == plain
    assert drafted.draft.verify_steps > 0
