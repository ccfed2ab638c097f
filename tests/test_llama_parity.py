"""The numpy reference against llama.cpp on the same synthesized GGUF: logits everywhere, greedy tokens.

F32 files: both sides compute in float32 from the same weights, so with f32 K/V caches logits agree to
float rounding (max |diff| <= 2e-3 on logits of standard deviation ~4) and greedy continuations are
identical. With f16 caches on both sides (llama.cpp's default and the runner's) every attention product
also rounds q, K, V and the softmax weights to f16 (F16's vec_dot_type on llama.cpp's CPU; the reference
does the same with llama_activations), and a 1e-7 difference upstream now and then moves one of those
roundings to the neighbouring f16 value: the reference against itself at micro-batch 7 and 256 moves by
up to 5e-3 that way (median 1.4e-3; measured on the glm4moe file), so the f16 bound is 1e-2; greedy
continuations are still identical (so are the small preset's, compared at f16). The quantized files
compare with f32 caches, where that noise is absent, so their bars stay what they were.

Quantized files: llama.cpp's CPU matmul rounds activations to Q8_0/Q8_1/Q8_K blocks first; the
reference does the same (runner/backends/numpy/activation_quant.py), so with no rounding flip the logits agree to
~1e-5. But float reassociation (BLAS vs ggml's SIMD sums, ggml's approximate expf) moves a few of the
hundreds of thousands of rounded activations per pass across a rounding boundary, and on these
random-weight models that grows to ~0.1-0.4 logits (measured: 1e-7 relative noise in our own
activations does the same), and now and then an expert choice flips and one position moves by
several logits. So the quantized bar is: teacher-forced on llama.cpp's own greedy continuation, the
median per-position deviation stays under 0.1 x the logits' std, and the argmax agrees at 95% of the
positions and at every position where no expert flip happened (deviation under NEAR_TIE) and
llama.cpp's top-2 margin is at least NEAR_TIE. Free-running greedy identity is recorded, not asserted.
"""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.parity.llama_oracle import LlamaOracle

PROMPT = "The quick brown fox jumps over the lazy dog. Offloading experts"
N_GREEDY = 32
F32_TOLERANCE = 2e-3  # F32 files, f32 K/V caches
F16_CACHE_TOLERANCE = 1e-2  # F32 files, f16 K/V caches (the docstring says why)
NEAR_TIE = 0.5  # logits; ~2x the largest deviation a rounding flip caused in the measurements above
# A rounding flip in a hybrid model's DeltaNet input stays in the recurrent state (decaying, never cut
# off as attention's share is), so every later position carries its 0.1-0.3 logits, not just the one: near
# ties then flip at more positions (measured over the 16 mixes: 94% to 100%). Clear positions still all agree.
MIN_ARGMAX_AGREEMENT = {"qwen35moe": 0.9, "qwen3next": 0.9}


def greedy(engine: Engine, prompt: list[int], n: int) -> list[int]:
    engine.reset()
    logits = engine.prefill(prompt)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = engine.decode(out[-1])
    return out


def top2_margin(logits: np.ndarray) -> np.ndarray:
    top = np.sort(logits, axis=-1)[..., -2:]
    return top[..., 1] - top[..., 0]


def compare(arch: str, path, record_property,
            kv_type: str = "f32") -> tuple[np.ndarray, np.ndarray, list[int], list[int]]:
    # llama.cpp's CPU activation rounding; odd micro-batch: prompts span several
    ops = NumpyOps(llama_activations=True, kv_type=kv_type)
    engine = Engine.load(path, EngineConfig(n_ctx=256, ubatch=7), ops=ops)
    prompt = engine.tokenizer.encode(PROMPT)
    with LlamaOracle(path, n_ctx=256, kv_type=kv_type) as oracle:
        want_tokens = oracle.greedy(prompt, N_GREEDY)
        want_logits = oracle.logits(prompt + want_tokens)
    got_logits = engine.logits_all(prompt + want_tokens)
    got_tokens = greedy(engine, prompt, N_GREEDY)
    deviation = np.abs(got_logits - want_logits).max(axis=-1)
    record_property("max_abs_logit_deviation", float(deviation.max()))
    record_property("median_abs_logit_deviation", float(np.median(deviation)))
    assert len(set(want_tokens)) >= N_GREEDY // 3, f"greedy continuation is not diverse: {want_tokens}"
    return got_logits, want_logits, got_tokens, want_tokens


@pytest.mark.parametrize("kv_type", ["f16", "f32"])
@pytest.mark.parametrize("arch", ["glm4moe", "qwen3moe", "qwen35moe", "qwen3next"])
def test_f32_logits_and_greedy_match_llama_cpp(synth_model, arch: str, kv_type: str, record_property) -> None:
    got_logits, want_logits, got_tokens, want_tokens = compare(arch, synth_model(arch, "F32"), record_property,
                                                               kv_type)
    bound = F32_TOLERANCE if kv_type == "f32" else F16_CACHE_TOLERANCE
    assert float(np.abs(got_logits - want_logits).max()) <= bound
    assert got_tokens == want_tokens


# Every llama.cpp file type that quantizes without an importance matrix; between them they put
# Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, IQ3_S, IQ4_NL, IQ4_XS, MXFP4 and BF16 tensors in the files.
QUANT_MIXES = ["Q8_0", "Q4_K_M", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_S", "Q5_K_M", "Q6_K",
               "IQ3_S", "IQ4_NL", "IQ4_XS", "MXFP4_MOE", "BF16"]


@pytest.mark.parametrize("arch", ["glm4moe", "qwen3moe", "qwen35moe", "qwen3next"])
@pytest.mark.parametrize("quant", QUANT_MIXES)
def test_quantized_logits_and_greedy_match_llama_cpp(synth_model, arch: str, quant: str, record_property) -> None:
    got_logits, want_logits, got_tokens, want_tokens = compare(arch, synth_model(arch, quant), record_property)
    assert_quantized_parity(arch, got_logits, want_logits)
    record_property("greedy_tokens_identical_prefix", identical_prefix(got_tokens, want_tokens))


def assert_quantized_parity(arch: str, got_logits: np.ndarray, want_logits: np.ndarray) -> None:
    """The quantized-file bar (the docstring says why): median deviation, argmax agreement, clear positions."""
    deviation = np.abs(got_logits - want_logits).max(axis=-1)
    assert float(np.median(deviation)) <= 0.1 * float(np.std(want_logits))
    agree = got_logits.argmax(-1) == want_logits.argmax(-1)
    assert agree.mean() >= MIN_ARGMAX_AGREEMENT.get(arch, 0.95), f"argmax agrees at only {agree.mean():.0%} of positions"
    clear = (top2_margin(want_logits) >= NEAR_TIE) & (deviation < NEAR_TIE)
    assert agree[clear].all(), f"argmax differs at clear positions {np.nonzero(clear & ~agree)[0].tolist()}"


def identical_prefix(got: list[int], want: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


@pytest.mark.parametrize("arch", ["glm4moe", "qwen3moe"])
def test_small_preset_matches_llama_cpp(synth_model, arch: str) -> None:
    """A second shape (16 experts, top-4, wider) with another seed, at F16 (activations rounded to F16), with
    f16 K/V caches (both sides' default)."""
    path = synth_model(arch, "F16", preset="small", seed=7)
    engine = Engine.load(path, EngineConfig(n_ctx=128), ops=NumpyOps(llama_activations=True, kv_type="f16"))
    prompt = engine.tokenizer.encode("Hello there, small model.")
    with LlamaOracle(path, n_ctx=128, kv_type="f16") as oracle:
        want = oracle.greedy(prompt, 16)
    assert greedy(engine, prompt, 16) == want
