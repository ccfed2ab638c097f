"""Batch invariance of the numpy backend: a verify batch of 1..8 rows computes each row bit for bit
as single-token decode does, on both architectures, in float32 and quantized files.

Speculative decoding is lossless only if this holds: the verify row of an accepted draft must give
exactly the logits (and K/V) that decoding that token alone would have given.
"""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.limits import SMALL_BATCH_ROWS
from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig

PROMPT = [11, 200, 37, 401, 5, 98, 310, 64, 7, 150, 222]
NEXT = [3, 499, 120, 45, 260, 18, 77, 333]  # the tokens fed as one batch or one at a time


@pytest.fixture(scope="module", params=[("glm4moe", "F32"), ("glm4moe", "Q4_K_M"), ("qwen3moe", "F32"),
                                        ("qwen3moe", "Q8_0")], ids=lambda p: f"{p[0]}-{p[1]}")
def engine(request, synth_model) -> Engine:
    arch, quant = request.param
    return Engine.load(synth_model(arch, quant, seed=31), EngineConfig(n_ctx=64, ubatch=16))


def _one_at_a_time(engine: Engine, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    logits, hidden = [], []
    for t in tokens:
        lg, h = engine.model.forward(np.asarray([t]), engine.kv)
        logits.append(lg[-1])
        hidden.append(h[-1])
    return np.stack(logits), np.stack(hidden)


@pytest.mark.parametrize("n_rows", range(1, SMALL_BATCH_ROWS + 1))
def test_each_row_of_a_small_batch_equals_single_token_decode(engine: Engine, n_rows: int) -> None:
    engine.reset()
    engine.prefill(PROMPT)
    n0 = engine.kv.n_tokens
    want_logits, want_hidden = _one_at_a_time(engine, NEXT[:n_rows])
    want_k = [k[n0 : n0 + n_rows].copy() for k in engine.kv.k]
    engine.kv.truncate(n0)
    logits, hidden = engine.model.forward(np.asarray(NEXT[:n_rows]), engine.kv, all_logits=True)
    assert np.array_equal(logits, want_logits)  # bitwise, not allclose
    assert np.array_equal(hidden, want_hidden)
    assert all(np.array_equal(k[n0 : n0 + n_rows], w) for k, w in zip(engine.kv.k, want_k))


def test_batch_invariance_holds_with_llama_activation_rounding(synth_model) -> None:
    engine = Engine.load(synth_model("glm4moe", "Q4_K_M", seed=31), EngineConfig(n_ctx=64),
                         ops=NumpyOps(llama_activations=True))
    engine.prefill(PROMPT)
    n0 = engine.kv.n_tokens
    want, _ = _one_at_a_time(engine, NEXT[:4])
    engine.kv.truncate(n0)
    got, _ = engine.model.forward(np.asarray(NEXT[:4]), engine.kv, all_logits=True)
    assert np.array_equal(got, want)


def test_nextn_block_is_batch_invariant_too(synth_model) -> None:
    engine = Engine.load(synth_model("glm4moe", "F32", seed=31), EngineConfig(n_ctx=64))
    block = engine.nextn[0]
    hidden = np.random.default_rng(3).standard_normal((5, block.cfg.n_embd)).astype(np.float32)
    kv = block.new_kv_cache(64)
    rows = [block.forward(hidden[i : i + 1], np.asarray([NEXT[i]]), kv)[0][-1] for i in range(5)]
    kv.truncate(0)
    batch, _ = block.forward(hidden, np.asarray(NEXT[:5]), kv)
    assert np.array_equal(batch, np.stack(rows))
