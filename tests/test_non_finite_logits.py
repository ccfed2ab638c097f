"""A model whose weights hold NaNs: the token it cannot choose ends the request with one error naming the
position (the CLI's error: line and exit 1; the server's 500), never a traceback or garbage text, and the
server goes on serving prompts that do not reach the broken weights."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest
from gguf_edit import rewrite_gguf
from test_server_harness import assert_openai_error, metric, metric_samples, serve_model

from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import NonFiniteLogits, Sampler, SamplingParams

PROMPT = [5, 6, 8]
GREEDY, SAMPLED = SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=1)


def with_nan(src, dst, tensor: str, row: int | None = None):
    def edit(name, qtype, data):
        if name == tensor:
            data = np.array(data, copy=True)
            data[row if row is not None else ...] = np.nan
        return name, qtype, data

    return rewrite_gguf(src, dst, tensor_edit=edit)


@pytest.fixture(scope="module")
def poisoned(synth_model, tmp_path_factory):
    """(path, token): a glm4moe whose embedding row of `token` is NaN, `token` being the second one greedy
    decoding of PROMPT picks (the same from the poisoned file); every logit after it is fed is NaN."""
    clean = synth_model("glm4moe")
    first_two = Engine.load(clean, EngineConfig(n_ctx=64)).generate(PROMPT, 2, GREEDY, ignore_eos=True).run().tokens
    token = first_two[1]
    assert token not in PROMPT
    return with_nan(clean, tmp_path_factory.mktemp("nan") / "embd-nan.gguf", "token_embd.weight", token), token


def test_the_sampler_refuses_non_finite_logits() -> None:
    for bad in (np.nan, np.inf, -np.inf):
        logits = np.zeros(8, dtype=np.float32)
        logits[3] = bad
        for params in (GREEDY, SAMPLED):
            with pytest.raises(NonFiniteLogits):
                Sampler(params)(logits)


@pytest.mark.parametrize("on_device,ahead", [(False, False), (True, False), (True, True)])
def test_the_engine_names_the_position(poisoned, on_device: bool, ahead: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chosen on the host or by the backend (Engine.GREEDY_ON_DEVICE), also a step ahead (GREEDY_AHEAD), the same
    error at the same position, and the cache holds exactly the positions the engine's record names."""
    monkeypatch.setattr(Engine, "GREEDY_ON_DEVICE", on_device)
    monkeypatch.setattr(Engine, "GREEDY_AHEAD", ahead)
    path, token = poisoned
    engine = Engine.load(path, EngineConfig(n_ctx=64))
    gen = engine.generate(PROMPT, 8, GREEDY, ignore_eos=True)
    seen = []
    with pytest.raises(NonFiniteLogits, match=f"non-finite logits \\(NaN or infinity\\) at position {len(PROMPT) + 2}:"):
        seen.extend(step.token for step in gen.steps())
    assert seen[1] == token and len(seen) == 2  # nothing chosen from the NaN logits
    assert engine.kv.n_tokens == len(engine.kv_tokens)  # a step past the NaN one (ahead) was dropped
    for params in (GREEDY, SAMPLED):  # sampling crashed inside numpy; greedy picked the NaN
        with pytest.raises(NonFiniteLogits, match=f"at position {len(PROMPT) + 1}:"):
            engine.generate([*PROMPT, token], 4, params).run()


def test_generate_is_one_error_line(synth_model, tmp_path) -> None:
    path = with_nan(synth_model("qwen3moe"), tmp_path / "head-nan.gguf", "output.weight")
    for temperature in ("0", "0.8"):
        out = subprocess.run([sys.executable, "-m", "runner.cli", "generate", str(path), "--prompt", "hi", "-n", "4",
                              "--temperature", temperature], capture_output=True, text=True, timeout=300,
                             check=False)
        assert out.returncode == 1 and out.stdout == "", out.stderr
        assert out.stderr.startswith("error: the model produced non-finite logits") and "Traceback" not in out.stderr
        assert out.stderr.strip().count("\n") == 0, out.stderr


def test_the_server_answers_500_and_stays_healthy(poisoned) -> None:
    path, token = poisoned
    with serve_model(path, n_ctx=64) as (url, app):
        def complete(prompt, **body):
            return httpx.post(f"{url}/v1/completions", timeout=60,
                              json={"prompt": prompt, "max_tokens": 4, "ignore_eos": True, **body})

        for temperature in (0, 0.8):
            error = assert_openai_error(complete([*PROMPT, token], temperature=temperature), 500)
            assert error["code"] == "non_finite_logits" and error["type"] == "server_error"
            assert f"at position {len(PROMPT) + 1}:" in error["message"]
        assert app.state.runner.engine.kv_tokens == []  # no cached KV that may hold the NaNs
        # Streamed, the tokens before the broken one go out, then the error in-band.
        stream = complete(PROMPT, temperature=0, stream=True, return_token_ids=True)
        events = [json.loads(e.removeprefix("data: ")) for e in stream.text.split("\n\n") if e and e != "data: [DONE]"]
        assert stream.status_code == 200 and stream.text.endswith("data: [DONE]\n\n")
        sent = [t for e in events[:-1] for c in e["choices"] for t in c.get("token_ids", [])]
        assert len(sent) <= 2 and sent[1:] in ([], [token])  # a token whose text was held back goes unreported
        assert events[-1]["error"]["code"] == "non_finite_logits"
        # Health stays ok: the file is broken, not the engine, and a prompt that avoids the row is served.
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        assert complete(PROMPT[:2], temperature=0, max_tokens=1).status_code == 200
        assert metric(metric_samples(url), "runner_non_finite_logits_total") == 3
