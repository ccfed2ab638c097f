"""The engine on the numpy backend: caching, micro-batching, stopping, sampling and its guards."""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.errors import GenerationError

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def engine(synth_model) -> Engine:
    return Engine.load(synth_model("glm4moe"), EngineConfig(n_ctx=128, ubatch=16))


@pytest.mark.parametrize(("kv_type", "atol"), [("f32", 1e-4), ("f16", 1e-3)])
def test_micro_batch_size_does_not_change_logits(synth_model, kv_type: str, atol: float) -> None:
    """Micro-batches sum in other orders; with an f16 cache a last-bit difference in K or V may round to the
    neighbouring f16 value (2^-11 relative), which moves the logits a little more."""
    path = synth_model("qwen3moe")
    tokens = list(range(40, 77))
    runs = [Engine.load(path, EngineConfig(n_ctx=64, ubatch=u), ops=NumpyOps(kv_type=kv_type)).logits_all(tokens)
            for u in (1, 5, 64)]
    np.testing.assert_allclose(runs[0], runs[1], atol=atol)
    np.testing.assert_allclose(runs[0], runs[2], atol=atol)


def test_prefix_reuse_gives_the_same_logits_as_a_fresh_prefill(engine: Engine) -> None:
    first = list(range(10, 40))
    longer = first + [300, 301, 302]
    engine.reset()
    engine.prefill(first)
    reused = engine.prefill(longer)
    assert engine.kv.n_tokens == len(longer)
    engine.reset()
    fresh = engine.prefill(longer)
    np.testing.assert_allclose(reused, fresh, atol=1e-4)


def test_generation_reports_cached_prompt_tokens(engine: Engine) -> None:
    engine.reset()
    prompt = engine.tokenizer.encode("a first request about caches")
    gen = engine.generate(prompt, 4, GREEDY, ignore_eos=True).run()
    follow_up = prompt + gen.tokens[:-1] + engine.tokenizer.encode(" and more")
    second = engine.generate(follow_up, 2, GREEDY, ignore_eos=True)
    assert second.cached_tokens == len(prompt) + len(gen.tokens) - 1
    second.run()
    assert second.timings()["cached_tokens"] == second.cached_tokens


def test_greedy_is_deterministic_and_text_matches_tokens(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("Deterministic greedy decoding")
    a = engine.generate(prompt, 12, GREEDY, ignore_eos=True).run()
    engine.reset()
    b = engine.generate(prompt, 12, GREEDY, ignore_eos=True).run()
    assert a.tokens == b.tokens and len(a.tokens) == 12
    assert a.text == engine.tokenizer.decode(a.tokens)
    assert a.finish_reason == "length"


def test_seeded_sampling_reproduces_and_seeds_differ(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("Sampling with a seed")
    hot = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    runs = [engine.generate(prompt, 16, SamplingParams(seed=s, **hot), ignore_eos=True).run().tokens
            for s in (1, 1, 2)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_stop_string_ends_generation_and_is_not_emitted(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("Stop strings")
    full = engine.generate(prompt, 24, GREEDY, ignore_eos=True).run()
    stop = full.text[5:8]
    assert len(stop) == 3
    cut = engine.generate(prompt, 24, GREEDY, stop=[stop], ignore_eos=True)
    pieces = list(cut.pieces())
    assert cut.finish_reason == "stop"
    assert "".join(pieces) == cut.text == full.text[: full.text.index(stop)]


def test_end_of_generation_token_stops_unless_ignored(engine: Engine, monkeypatch) -> None:
    prompt = engine.tokenizer.encode("ends here")
    engine.reset()
    first = int(np.argmax(engine.prefill(prompt)))
    monkeypatch.setattr(engine.tokenizer, "is_eog", lambda t: t == first)
    stopped = engine.generate(prompt, 8, GREEDY).run()
    assert stopped.tokens == [] and stopped.finish_reason == "stop" and stopped.text == ""
    ignored = engine.generate(prompt, 3, GREEDY, ignore_eos=True).run()
    assert ignored.tokens[0] == first and ignored.finish_reason == "length"


def test_prompt_filling_the_context_is_refused_and_max_tokens_stops_at_its_end(engine: Engine) -> None:
    with pytest.raises(GenerationError, match=r"prompt \(128 tokens\) exceeds the context \(128\)"):
        engine.generate([5] * 128, 1, GREEDY)
    capped = engine.generate([5] * 120, 4096, GREEDY, ignore_eos=True).run()
    assert len(capped.tokens) == 8 and capped.finish_reason == "length"


def test_out_of_vocabulary_token_and_empty_prompt_are_refused(engine: Engine) -> None:
    with pytest.raises(GenerationError, match="outside the vocabulary"):
        engine.generate([1, 99999], 1, GREEDY)
    with pytest.raises(GenerationError, match="empty"):
        engine.generate([], 1, GREEDY).run()


def test_logprobs_are_the_model_distribution(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("log probabilities")
    engine.reset()
    first_logits = engine.prefill(prompt)
    steps = [s for s in engine.generate(prompt, 3, GREEDY, ignore_eos=True, logprobs=5).steps() if s.token is not None]
    want = first_logits - np.log(np.exp(first_logits - first_logits.max()).sum()) - first_logits.max()
    assert steps[0].logprob == pytest.approx(float(want[steps[0].token]), abs=1e-5)
    assert [t for t, _ in steps[0].top_logprobs] == list(np.argsort(-want, kind="stable")[:5])
    assert steps[0].top_logprobs[0][0] == steps[0].token  # greedy picks the most likely


def test_frequency_penalty_discourages_repeats(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("repeat repeat repeat")
    plain = engine.generate(prompt, 24, GREEDY, ignore_eos=True).run().tokens
    penalised = engine.generate(prompt, 24, SamplingParams(temperature=0.0, frequency_penalty=2.0),
                                ignore_eos=True).run().tokens
    assert len(set(penalised)) >= len(set(plain))
    assert max(penalised.count(t) for t in penalised) <= max(plain.count(t) for t in plain)
    with pytest.raises(GenerationError, match="presence_penalty"):
        SamplingParams(presence_penalty=3.0)


def test_consumer_can_stop_early_and_engine_stays_usable(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("cut short")
    gen = engine.generate(prompt, 20, GREEDY, ignore_eos=True)
    steps = gen.steps()
    next(steps), next(steps)
    steps.close()  # a client that disconnects
    assert gen.finish_reason is None and len(gen.tokens) == 2
    again = engine.generate(prompt, 4, GREEDY, ignore_eos=True).run()
    assert again.tokens[:2] == gen.tokens and again.finish_reason == "length"


def test_cancel_stops_a_long_prompt_between_micro_batches(synth_model) -> None:
    engine = Engine.load(synth_model("qwen3moe"), EngineConfig(n_ctx=256, ubatch=8))
    prompt = list(range(20, 60))
    asked = []

    def cancelled() -> bool:
        asked.append(len(engine.kv_tokens))
        return len(asked) > 2  # let two micro-batches through, then the client is gone

    gen = engine.generate(prompt, 5, GREEDY, cancelled=cancelled).run()
    assert gen.tokens == [] and gen.finish_reason is None
    assert engine.kv_tokens == prompt[:16]
    again = engine.generate(prompt, 2, GREEDY, ignore_eos=True)
    assert again.cached_tokens == 16
    again.run()
    engine.reset()
    assert engine.generate(prompt, 2, GREEDY, ignore_eos=True).run().tokens == again.tokens


def test_numpy_moe_adds_a_residual_last() -> None:
    """NumpyOps.moe(..., residual=r) is r + moe(...): the decoder's skip connection moved into the op keeps its bits."""
    from runner.backends.numpy.ops import NumpyOps
    from runner.gguf_file import open_gguf
    from runner.models.config import model_config
    from runner.models.weights import MoEWeights, load_weights
    from runner.package_data import demo_model_path

    f = open_gguf(demo_model_path())
    cfg = model_config(f)
    ops = NumpyOps()
    w = next(lw.ffn for lw in load_weights(f, cfg).layers if isinstance(lw.ffn, MoEWeights))
    rng = np.random.default_rng(3)
    x, r = (rng.standard_normal((3, cfg.n_embd)).astype(np.float32) for _ in range(2))
    ids, weights = ops.route(ops.linear(x, w.router), w.probs_bias, cfg)
    shared = w.shared is not None
    got = ops.moe(x, ids, weights, w, with_shared=shared, residual=r)
    np.testing.assert_array_equal(got, r + ops.moe(x, ids, weights, w, with_shared=shared))


def test_numpy_linear_adds_a_residual_last() -> None:
    """NumpyOps.linear(h, w, b, residual=r) is r + linear(h, w, b): the attention's skip connection in its output
    projection's op keeps its bits."""
    from runner.backends.numpy.ops import NumpyOps
    from runner.gguf_file import open_gguf
    from runner.models.config import model_config
    from runner.models.weights import load_weights
    from runner.package_data import demo_model_path

    f = open_gguf(demo_model_path())
    cfg = model_config(f)
    ops = NumpyOps()
    a = load_weights(f, cfg).layers[0].attn
    rng = np.random.default_rng(4)
    h = rng.standard_normal((3, a.wo.shape[-1])).astype(np.float32)
    r = rng.standard_normal((3, cfg.n_embd)).astype(np.float32)
    np.testing.assert_array_equal(ops.linear(h, a.wo, residual=r), r + ops.linear(h, a.wo))
