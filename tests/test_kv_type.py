"""The K/V cache's element type (--cache-type, backends/kv_type.py) on the numpy backend: float16 by default,
as llama.cpp stores it, float32 on request. K/V are rounded to the type as they are stored (to nearest even,
the rounding CuPy's cast does too), attention widens them to float32 before its products, and everything
that reads or writes the cache (rollback, verify, the prompt cache's save and restore, a hybrid's cache,
the sizing) works in either type, f16 at half the bytes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from runner.backends.kv_type import DEFAULT_KV_TYPE, KV_TYPES, check_kv_type
from runner.backends.numpy.ops import NumpyOps
from runner.cli.main import main
from runner.engine.engine import Engine, EngineConfig
from runner.engine.kv_cache import KVCache
from runner.gguf_file import open_gguf
from runner.models.config import model_config
from runner.offload.sizing import kv_bytes_per_token, kv_cache_bytes

KV = ["f16", "f32"]
PROMPT = [7, 93, 411, 250, 18, 333, 64, 120, 5, 499, 77, 201, 14, 9, 300, 41, 2, 88, 150, 61]


def _engine(path, kv_type: str, **config) -> Engine:
    return Engine.load(path, EngineConfig(**{"n_ctx": 128, "ubatch": 8, **config}), ops=NumpyOps(kv_type=kv_type))


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def test_the_default_is_f16_and_anything_but_f16_or_f32_is_refused_in_one_line() -> None:
    assert DEFAULT_KV_TYPE == "f16" and NumpyOps().kv_type == "f16"
    assert check_kv_type("f32") == "f32"
    for bad in ("q8_0", "F16", "bf16", None):
        with pytest.raises(ValueError, match=r"^--cache-type must be f16 \(the default, llama.cpp's\) or f32, got "):
            NumpyOps(kv_type=bad)


@pytest.mark.parametrize("kv_type", KV)
def test_stored_rows_are_rounded_to_the_cache_type_to_nearest_even(kv_type: str) -> None:
    dtype = KV_TYPES[kv_type]
    kv = KVCache(NumpyOps(kv_type=kv_type), 2, 16, 2, 4)
    assert kv.k[1].dtype == dtype and kv.v[0].nbytes == 16 * 2 * 4 * dtype.itemsize
    k = np.random.default_rng(0).standard_normal((3, 2, 4)).astype(np.float32)
    k[0, 0, :3] = [1 + 2**-11, 1 + 3 * 2**-11, 70000.0]  # two ties between f16 neighbours, one past f16's range
    with np.errstate(over="ignore"):  # 70000 becomes inf in f16, as in llama.cpp's cache
        k_all, v_all = kv.store(1, np.arange(3), k, -k, None)
        want_k, want_v = k.astype(dtype), (-k).astype(dtype)
    assert k_all.dtype == v_all.dtype == dtype and k_all.shape == (3, 2, 4)
    np.testing.assert_array_equal(k_all, want_k)
    np.testing.assert_array_equal(v_all, want_v)
    if kv_type == "f16":
        assert k_all[0, 0, :3].tolist() == [1.0, 1 + 2**-9, np.inf]  # ties go to the even neighbour


@pytest.mark.parametrize("n_rows", [3, 12])  # row by row (a verify batch), and a prompt's whole batch
def test_attention_over_an_f16_cache_is_float32_attention_over_its_rounded_values(n_rows: int) -> None:
    rng = np.random.default_rng(n_rows)
    q = rng.standard_normal((n_rows, 4, 8)).astype(np.float32)
    k, v = (rng.standard_normal((20, 2, 8)).astype(np.float16) for _ in range(2))
    positions = np.arange(20 - n_rows, 20)
    got = NumpyOps().attention(q, k, v, positions)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, NumpyOps().attention(q, k.astype(np.float32), v.astype(np.float32), positions))


def _llama_cpu_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """llama.cpp's CPU attention over an f16 cache, flash attention off: K q with q rounded to f16 (F16's
    vec_dot_type), the softmax in float32, then V P with P rounded to f16."""
    n_tok, n_head, dim = q.shape
    group = n_head // k.shape[1]
    out = np.empty_like(q)
    for h in range(n_head):
        kh, vh = k[:, h // group].astype(np.float32), v[:, h // group].astype(np.float32)
        scores = _f16(q[:, h]) @ kh.T * np.float32(1 / np.sqrt(dim))
        scores[np.arange(len(kh))[None, :] > positions[:, None]] = -np.inf
        p = np.exp(scores - scores.max(-1, keepdims=True))
        out[:, h] = _f16(p / p.sum(-1, keepdims=True)) @ vh
    return out.reshape(n_tok, n_head * dim)


def test_llama_activations_round_q_and_the_softmax_weights_over_an_f16_cache_only() -> None:
    rng = np.random.default_rng(5)
    q = rng.standard_normal((12, 4, 8)).astype(np.float32)
    k, v = (rng.standard_normal((20, 2, 8)).astype(np.float16) for _ in range(2))
    positions = np.arange(8, 20)
    llama = NumpyOps(llama_activations=True)
    got = llama.attention(q, k, v, positions)
    np.testing.assert_allclose(got, _llama_cpu_attention(q, k, v, positions), rtol=0, atol=1e-6)
    assert np.abs(got - NumpyOps().attention(q, k, v, positions)).max() > 1e-5  # the rounding shows
    k32, v32 = k.astype(np.float32), v.astype(np.float32)  # an f32 cache: llama.cpp rounds nothing here
    np.testing.assert_array_equal(llama.attention(q, k32, v32, positions), NumpyOps().attention(q, k32, v32, positions))


def test_f16_and_f32_caches_agree_closely_and_pick_the_same_greedy_tokens(synth_model) -> None:
    path = synth_model("glm4moe")
    half, full = _engine(path, "f16"), _engine(path, "f32")
    assert half.kv.k[0].dtype == np.float16 and full.kv.k[0].dtype == np.float32
    assert 2 * sum(b.nbytes for b in (*half.kv.k, *half.kv.v)) == sum(b.nbytes for b in (*full.kv.k, *full.kv.v))
    a, b = half.logits_all(PROMPT), full.logits_all(PROMPT)
    assert np.abs(a - b).max() < 1e-2 * np.std(b)  # K/V's 2^-11 relative rounding, through the layers
    assert (a.argmax(-1) == b.argmax(-1)).all()
    half.reset(), full.reset()
    want = full.generate(PROMPT, 12, _greedy(), ignore_eos=True).run().tokens
    assert half.generate(PROMPT, 12, _greedy(), ignore_eos=True).run().tokens == want


def _greedy():
    from runner.engine.sampling import SamplingParams

    return SamplingParams(temperature=0.0)


@pytest.mark.parametrize("kv_type", KV)
def test_a_verify_batch_rolled_back_gives_decode_s_logits(synth_model, kv_type: str) -> None:
    engine = _engine(synth_model("glm4moe"), kv_type)
    engine.prefill(PROMPT)
    rows, _ = engine.verify([5, 6, 7, 8])
    engine.rollback(len(PROMPT) + 1)  # keep the pending token, reject the drafts
    assert engine.kv.n_tokens == len(PROMPT) + 1
    decoded = [engine.decode(t) for t in (6, 7)]
    np.testing.assert_array_equal(np.stack(decoded), rows[1:3])  # batch invariant, whatever the cache type


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35moe"])
@pytest.mark.parametrize("kv_type", KV)
def test_a_saved_sequence_restores_its_bits_at_half_the_bytes_in_f16(synth_model, arch: str, kv_type: str) -> None:
    path = synth_model(arch)
    engine, fresh = _engine(path, kv_type), _engine(path, kv_type)
    engine.prefill(PROMPT)
    saved = engine.kv.save()
    assert {a.dtype for a in (*saved.k, *saved.v)} == {KV_TYPES[kv_type]}
    kv_bytes = sum(a.nbytes for a in (*saved.k, *saved.v))
    assert kv_bytes == 2 * len(saved.k) * len(PROMPT) * engine.model_config.n_head_kv * \
        engine.model_config.head_dim * KV_TYPES[kv_type].itemsize
    assert engine.kv.saved_bytes() == saved.nbytes
    fresh.kv.load(saved, len(PROMPT))
    fresh.kv_tokens[:] = PROMPT
    np.testing.assert_array_equal(fresh.decode(42), engine.decode(42))


def test_k_v_saved_in_one_type_is_not_loaded_into_the_other(synth_model) -> None:
    path = synth_model("glm4moe")
    engine = _engine(path, "f16")
    engine.prefill(PROMPT)
    with pytest.raises(ValueError, match="cannot load K/V saved as float16 into a float32 cache"):
        _engine(path, "f32").kv.load(engine.kv.save(), len(PROMPT))


def test_sizing_counts_two_bytes_a_value_in_f16(synth_model) -> None:
    cfg = model_config(open_gguf(synth_model("glm4moe")))
    per_layer = 2 * cfg.n_head_kv * cfg.head_dim
    for drafting in (False, True):
        assert kv_bytes_per_token(cfg, drafting) == kv_bytes_per_token(cfg, drafting, "f16")
        assert 2 * kv_bytes_per_token(cfg, drafting, "f16") == kv_bytes_per_token(cfg, drafting, "f32")
    assert kv_bytes_per_token(cfg, False, "f16") == cfg.n_layer * per_layer * 2
    assert kv_cache_bytes(cfg, 1000, "f32") == 2 * kv_cache_bytes(cfg, 1000, "f16")
    assert kv_cache_bytes(cfg, 1000, "f32") == 1000 * cfg.n_layer * per_layer * 4


def _generate(*args: str):
    return CliRunner().invoke(main, ["generate", *args, "-p", "hi", "-n", "2", "--temperature", "0", "--json"])


def test_cache_type_flags_reach_the_launch_and_bad_ones_are_one_line(synth_model) -> None:
    path = str(synth_model("qwen3moe"))
    for flags, want in (((), "f16"), (("--cache-type", "f32"), "f32"), (("-ctk", "F32", "-ctv", "f32"), "f32"),
                        (("--cache-type-v", "f16"), "f16")):
        out = _generate(path, "--backend", "numpy", *flags)
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["launch"]["backend"]["kv_type"] == want, flags
    refusals = ((("--cache-type", "q8_0"), "'q8_0': the K/V cache stores f16 (the default, llama.cpp's) or f32"),
                (("-ctk", "f16", "-ctv", "f32"), "-ctk f16, -ctv f32: K and V are cached in one type here"))
    for flags, says in refusals:
        out = _generate(path, "--backend", "numpy", *flags)
        assert out.exit_code == 1 and len(out.output.splitlines()) == 1 and says in out.output, out.output


def test_a_split_planned_for_one_type_is_refused_by_an_engine_storing_the_other(synth_model) -> None:
    from runner.errors import GenerationError
    from runner.launch.devices import SplitConfig

    split = SplitConfig((0, 1), 1 << 40, slots=2, rows=8, kv_type="f32")
    with pytest.raises(GenerationError, match="planned for K/V cached as f32, but the backend stores f16"):
        _engine(synth_model("glm4moe"), "f16", split=split)
    assert _engine(synth_model("glm4moe"), "f32", split=split).kv.k[0].dtype == np.float32
