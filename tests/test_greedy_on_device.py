"""Engine.GREEDY_ON_DEVICE: plain greedy requests take each decoded token from the backend's argmax
(ops.greedy_token) instead of the downloaded logits row. The same tokens, text and finish reasons as choosing on
the host, resident and under expert offload; every other request (sampling, penalties, a bias, logprobs) still
chooses on the host; and the backend's choice matches np.argmax's, ties and non-finite rows included."""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.engine.generation import GenerationRequest, is_plain_greedy
from runner.engine.sampling import SamplingParams
from runner.offload.offload import OffloadConfig

PROMPT = [5, 6, 8, 13, 21]
GREEDY = SamplingParams(temperature=0.0)


class CountingOps(NumpyOps):
    """NumpyOps that counts the backend's greedy choices."""

    def __init__(self) -> None:
        super().__init__()
        self.greedy_calls = 0

    def greedy_token(self, logits):
        self.greedy_calls += 1
        return super().greedy_token(logits)


@pytest.fixture(scope="module", params=["resident", "offload"])
def engine(request, synth_model) -> Engine:
    offload = OffloadConfig(cache_slots=3, prefill_ubatch=8, transaction="always") if request.param == "offload" else None
    return Engine.load(synth_model("glm4moe"), EngineConfig(n_ctx=96, ubatch=8, offload=offload), ops=CountingOps())


def _run(engine: Engine, on: bool, monkeypatch: pytest.MonkeyPatch, **kwargs) -> tuple:
    monkeypatch.setattr(Engine, "GREEDY_ON_DEVICE", on)
    monkeypatch.setattr(Engine, "GREEDY_AHEAD", False)  # a step at a time (the chain: tests/test_greedy_ahead.py)
    engine.reset()
    before = engine.ops.greedy_calls
    gen = engine.generate(PROMPT, kwargs.pop("n", 12), kwargs.pop("sampling", GREEDY), **kwargs).run()
    return (gen.tokens, gen.text, gen.finish_reason), engine.ops.greedy_calls - before


@pytest.mark.parametrize("kwargs", [{"ignore_eos": True}, {}, {"stop": (" ",)}, {"n": 1}, {"n": 30, "ignore_eos": True}])
def test_plain_greedy_on_the_device_gives_the_hosts_tokens(engine: Engine, monkeypatch, kwargs: dict) -> None:
    on_host, calls_off = _run(engine, False, monkeypatch, **dict(kwargs))
    on_device, calls_on = _run(engine, True, monkeypatch, **dict(kwargs))
    assert on_device == on_host
    assert calls_off == 0
    assert calls_on == max(len(on_host[0]) - 1, 0) + (on_host[2] == "stop" and "stop" not in kwargs)  # an EOG ends it


@pytest.mark.parametrize("sampling,kwargs", [
    (SamplingParams(temperature=0.8, seed=3), {}),
    (SamplingParams(temperature=0.0, frequency_penalty=1.0), {}),
    (SamplingParams(temperature=0.0, repeat_penalty=1.3), {}),
    (SamplingParams(temperature=0.0, logit_bias=((7, 5.0),)), {}),
    (GREEDY, {"logprobs": 2}),
])
def test_other_requests_still_choose_on_the_host(engine: Engine, monkeypatch, sampling, kwargs: dict) -> None:
    on_host, _ = _run(engine, False, monkeypatch, sampling=sampling, ignore_eos=True, **dict(kwargs))
    flagged, calls = _run(engine, True, monkeypatch, sampling=sampling, ignore_eos=True, **dict(kwargs))
    assert calls == 0 and flagged == on_host
    assert not is_plain_greedy(GenerationRequest(8, sampling, logprobs=kwargs.get("logprobs")))


def test_the_backends_choice_is_np_argmax_and_refuses_non_finite_rows() -> None:
    ops = NumpyOps()
    rng = np.random.default_rng(0)
    for row in (rng.standard_normal(1000).astype(np.float32), np.zeros(7, np.float32),
                np.array([1.0, 3.0, 3.0, -2.0], np.float32), np.array([-0.0, 0.0], np.float32)):
        assert ops.greedy_token(row[None]) == int(np.argmax(row))
    for bad in (np.nan, np.inf, -np.inf):
        row = np.ones(5, np.float32)
        row[2] = bad
        assert ops.greedy_token(row) is None
