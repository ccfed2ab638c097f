"""Engine.GREEDY_AHEAD on the GPU: DeviceGreedyChain replays the whole-step decode graph one step behind the
other, each step reading the token the one before chose on the device. The same tokens as a step at a time,
resident and under offload's directory graphs (segmented graphs fall back to a step at a time), a cache whose
record names exactly its positions after every way a request ends, and one GPU time per timed replay."""

from __future__ import annotations

import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

from runner.backends.cuda import ops as cuda_ops  # noqa: E402
from runner.backends.cuda.greedy_chain import DeviceGreedyChain  # noqa: E402
from runner.backends.greedy_chain import SyncGreedyChain  # noqa: E402
from runner.engine.engine import Engine, EngineConfig  # noqa: E402
from runner.engine.sampling import SamplingParams  # noqa: E402
from runner.offload.offload import OffloadConfig  # noqa: E402

PROMPT = [7, 93, 411, 250, 18, 333, 64, 120, 5, 499, 77, 201]
GREEDY = SamplingParams(temperature=0.0)
KINDS = {"resident": None, "directory": "directory", "segments": "segments"}


@pytest.fixture(scope="module")
def model_path(synth_model):
    return synth_model("glm4moe", "Q4_K_M", seed=75, direct=True)


@pytest.fixture(scope="module", params=list(KINDS))
def engine(request, model_path) -> Engine:
    kind = KINDS[request.param]
    offload = None if kind is None else OffloadConfig(cache_slots=8, decode_graph=kind, transaction="always")
    return Engine.load(model_path, EngineConfig(n_ctx=512, ubatch=64, offload=offload), ops=cuda_ops.CudaOps())


def _generate(engine: Engine, ahead: bool, monkeypatch, prompt: list[int], n: int, **kwargs) -> tuple:
    monkeypatch.setattr(Engine, "GREEDY_AHEAD", ahead)
    gen = engine.generate(prompt, n, GREEDY, **kwargs).run()
    assert engine.kv.n_tokens == len(engine.kv_tokens)
    assert engine.kv_tokens[: len(prompt) + len(gen.tokens) - 1] == [*prompt, *gen.tokens[:-1]]
    return gen.tokens, gen.text, gen.finish_reason


@pytest.mark.parametrize("n,kwargs", [(64, {"ignore_eos": True}), (24, {}), (24, {"stop": (" ",)}), (1, {}), (2, {})])
def test_a_step_ahead_on_the_device_gives_the_same_tokens_and_the_same_next_turn(engine: Engine, monkeypatch,
                                                                                 n: int, kwargs: dict) -> None:
    got = {}
    for ahead in (False, True):
        engine.reset()
        first = _generate(engine, ahead, monkeypatch, PROMPT, n, **dict(kwargs))
        follow = _generate(engine, ahead, monkeypatch, [*PROMPT, *first[0], 9, 11], 16, ignore_eos=True)
        got[ahead] = first, follow
    assert got[True] == got[False]


def test_the_chain_is_the_devices_where_one_graph_serves_a_step(engine: Engine) -> None:
    engine.reset()
    engine.generate(PROMPT, 4, GREEDY, ignore_eos=True).run()  # the graphs exist
    chain = engine.ops.greedy_chain(engine.model, engine.kv, engine.step)
    segmented = engine.offload is not None and engine.offload.config.decode_graph == "segments"
    assert isinstance(chain, SyncGreedyChain if segmented else DeviceGreedyChain)


def test_timed_replays_each_give_one_gpu_time(engine: Engine, monkeypatch) -> None:
    """The profile's replay timing: events around each launch, collected once they are done, not waited on."""
    monkeypatch.setattr(Engine, "GREEDY_AHEAD", True)
    engine.reset()
    engine.generate(PROMPT, 4, GREEDY, ignore_eos=True).run()  # warm-up and capture
    engine.ops.replay_times_ms = times = []
    try:
        engine.reset()
        gen = engine.generate(PROMPT, 20, GREEDY, ignore_eos=True).run()
    finally:
        engine.ops.replay_times_ms = None
    segmented = engine.offload is not None and engine.offload.config.decode_graph == "segments"
    assert len(times) == (0 if segmented else len(gen.tokens) - 1) and all(t > 0 for t in times)
