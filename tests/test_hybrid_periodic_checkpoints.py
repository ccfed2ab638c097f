"""Periodic checkpoints of a hybrid's DeltaNet state (hybrid_cache.PeriodicCheckpoints): a long prompt leaves
host-RAM checkpoints every N tokens (at the end of the batch that reaches each multiple, at most `keep`), so a
later prompt that leaves it midway restarts from the nearest one before, with a fresh prefill's logits, and
computes only the suffix past it. Scaled down here: N of 32 to 64 tokens where the default is 2048."""

from __future__ import annotations

import numpy as np
import pytest

from runner.engine.engine import Engine, EngineConfig
from runner.engine.hybrid_cache import PeriodicCheckpoints
from runner.engine.sampling import SamplingParams
from runner.offload.offload import OffloadConfig
from runner.spec.config import DraftConfig

HYBRIDS = ["qwen35moe", "qwen3next"]
PROMPT = [(i * 37 + 11) % 500 + 5 for i in range(200)]
GREEDY = SamplingParams(temperature=0.0)


def _engine(path, ubatch: int = 16, every: int = 32, keep: int = 8, **config) -> Engine:
    engine = Engine.load(path, EngineConfig(n_ctx=256, ubatch=ubatch, **config))
    engine.kv.periodic = PeriodicCheckpoints(every, keep)
    return engine


def _periodic(engine: Engine) -> list[int]:
    return sorted(p for p, s in engine.kv.snapshots.items() if s.periodic)


def counting_forward_rows(engine: Engine, monkeypatch) -> list[int]:
    """The rows each trunk forward computes from now on."""
    computed: list[int] = []
    forward = engine.model.forward

    def counting(tokens, *args, **kwargs):
        computed.append(len(tokens))
        return forward(tokens, *args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", counting)
    return computed


@pytest.mark.parametrize("arch", HYBRIDS)
def test_a_prompt_leaving_a_long_one_midway_restarts_from_the_nearest_periodic_checkpoint(
        synth_model, monkeypatch, arch: str) -> None:
    path = synth_model(arch)
    engine = _engine(path)
    engine.prefill(PROMPT)
    assert _periodic(engine) == [32, 64, 96, 128, 160, 192]  # and the prompt's end, 200, a checkpoint
    branch = PROMPT[:150] + [7, 8, 9, 10]
    assert engine.kv.reachable(150) == 128  # before: 0, a re-prefill of all 154
    computed = counting_forward_rows(engine, monkeypatch)
    got = engine.prefill(branch)
    assert sum(computed) == len(branch) - 128  # only the suffix past the checkpoint
    fresh = _engine(path, every=0)
    np.testing.assert_array_equal(got, fresh.prefill(branch))  # the same batches from 128 on: the same bits
    assert _periodic(engine) == [32, 64, 96, 128]  # those past 150 belonged to the other prompt
    again = engine.prefill(PROMPT)  # back to the first prompt: from 128 again, same logits as its first time
    np.testing.assert_array_equal(again, fresh.prefill(PROMPT))


def test_checkpoints_land_at_the_batch_that_reaches_each_multiple(synth_model) -> None:
    engine = _engine(synth_model("qwen35moe"), ubatch=24, every=50)
    engine.prefill(PROMPT)  # batches end at 24, 48, 72, ...: 50 is reached at 72, 100 at 120, ...
    assert _periodic(engine) == [72, 120, 168, 200]  # 200 also ends the prompt: that checkpoint is the host's


def test_past_keep_every_other_checkpoint_goes_and_the_spacing_doubles(synth_model) -> None:
    path = synth_model("qwen3next")
    engine = _engine(path, every=16, keep=4)
    engine.prefill(PROMPT)  # multiples 1..12 of 16: stride 4 keeps 64, 128 and 192
    assert _periodic(engine) == [64, 128, 192]
    branch = PROMPT[:100] + [1, 2, 3]
    engine.prefill(branch)
    assert _periodic(engine) == [64]  # and new ones are taken at the doubled spacing only
    engine.prefill(branch + PROMPT[:120])  # from 103, the branch's end: batches reach 128 at 135, 192 at 199
    assert _periodic(engine) == [64, 135, 199]


@pytest.mark.parametrize("arch", HYBRIDS)
def test_a_layer_major_offloaded_prompt_leaves_the_same_checkpoints(synth_model, monkeypatch, arch: str) -> None:
    """Layer-major runs every chunk through a layer before the next: each DeltaNet layer's state at a chunk
    end goes to the host as it is made, and the prompt's checkpoints are complete once it advances."""
    path = synth_model(arch, "Q8_0")
    offload = OffloadConfig(cache_slots=3, prefill_ubatch=16, transaction="always", prefill_order="layer_major")
    engine = _engine(path, offload=offload)
    engine.prefill(PROMPT)
    assert engine.stats()["phase"]["begins"] == 1 and _periodic(engine) == [32, 64, 96, 128, 160, 192]
    branch = PROMPT[:100] + [3, 2, 1]
    assert engine.kv.reachable(100) == 96
    got = engine.prefill(branch)
    np.testing.assert_array_equal(got, _engine(path, every=0).prefill(branch))
    asked = iter([False, False, True])  # a prompt cancelled between layers leaves none of its checkpoints
    assert engine.prefill(PROMPT[:40] + list(range(300, 400)), cancelled=lambda: next(asked, True)) is None
    assert _periodic(engine) == [32]


def test_periodic_checkpoints_leave_mtp_drafting_lossless(synth_model) -> None:
    """Decode and verify batches crossing a multiple take checkpoints too; a verify batch's rejected rows
    drop theirs with the rollback, and greedy drafting still equals plain decoding."""
    path = synth_model("qwen35moe")
    prompt = PROMPT[:40]
    plain = _engine(path, every=0).generate(prompt, 60, GREEDY, ignore_eos=True).run().tokens
    engine = _engine(path, every=8, keep=64)
    drafted = engine.generate(prompt, 60, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 3, adaptive=False)).run()
    assert drafted.tokens == plain
    assert drafted.draft.accepted_n < drafted.draft.drafted_n  # rejections rolled back
    assert max(_periodic(engine)) >= 90 and all(p <= engine.kv.n_tokens for p in _periodic(engine))


def test_the_prompt_cache_saves_and_restores_the_periodic_checkpoints(synth_model, monkeypatch) -> None:
    """A conversation saved to host RAM keeps its periodic checkpoints: a prompt that leaves it midway
    after another conversation restores the nearest one and computes only the rest."""
    path = synth_model("qwen3next")
    engine = _engine(path, prompt_cache_bytes=64 << 20)
    engine.generate(PROMPT, 1, GREEDY, ignore_eos=True).run()  # conversation A: checkpoints 32..192
    engine.generate(list(range(400, 440)), 1, GREEDY, ignore_eos=True).run()  # B: A goes to the prompt cache
    branch = PROMPT[:170] + [9, 9]
    computed = counting_forward_rows(engine, monkeypatch)
    gen = engine.generate(branch, 1, GREEDY, ignore_eos=True)
    assert gen.cached_tokens == gen.restored_tokens == 160  # from host RAM: the saved conversation's checkpoint
    gen.run()
    assert computed[0] == len(branch) - 160
