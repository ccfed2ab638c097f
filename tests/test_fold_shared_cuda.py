"""The shared expert folded into the routed experts' decode launches (CudaOps.moe with_shared at 1..8 rows): one
more pair per token, added by combine after the routed sum, gives the composed ops' bits (moe, then
swiglu_ffn added), with resident experts and through every decode graph kind under offload.

A fresh model (seed 95, the small glm4moe preset: 3 MoE layers of 16 experts, one shared expert) no other test uses.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda.ops import CudaOps  # noqa: E402
from runner.engine.engine import Engine, EngineConfig  # noqa: E402
from runner.engine.sampling import SamplingParams  # noqa: E402
from runner.models.weights import MoEWeights  # noqa: E402
from runner.offload.offload import OffloadConfig  # noqa: E402
from runner.spec.config import DraftConfig  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def path(synth_model):
    return synth_model("glm4moe", "Q4_K_M", preset="small", seed=95, direct=True)


def test_the_fold_gives_the_composed_bits_at_every_decode_row_count(path) -> None:
    engine = Engine.load(path, EngineConfig(n_ctx=64), ops=CudaOps())
    ops, cfg = engine.ops, engine.model_config
    layers = [lw.ffn for lw in engine.model.weights.layers if isinstance(lw.ffn, MoEWeights)]
    assert layers and all(ops.fold_tail(w) is not None for w in layers)  # Q4_K_M: the same types as the experts
    rng = np.random.default_rng(95)
    for rows in (1, 3, 8, 9):  # 9: a prompt's rows, composed either way
        x = cp.asarray(rng.standard_normal((rows, cfg.n_embd)).astype(np.float32))
        for w in layers:
            ids, weights = ops.route(ops.linear(x, w.router), w.probs_bias, cfg)
            got = ops.moe(x, ids, weights, w, with_shared=True)
            want = ops.moe(x, ids, weights, w) + ops.swiglu_ffn(x, w.shared.gate, w.shared.up, w.shared.down)
            np.testing.assert_array_equal(cp.asnumpy(got), cp.asnumpy(want), err_msg=f"{rows} rows, {w.router.name}")


def test_a_shared_expert_of_another_shape_is_not_folded(path) -> None:
    ops = CudaOps()
    engine = Engine.load(path, EngineConfig(n_ctx=64), ops=ops)
    w = next(lw.ffn for lw in engine.model.weights.layers if isinstance(lw.ffn, MoEWeights))
    other = dataclasses.replace(w.shared, down=w.gate_exps)  # 3-D: not one expert's down matrix
    assert ops.fold_tail(dataclasses.replace(w, shared=other)) is None and ops.fold_tail(w) is not None


@pytest.mark.parametrize("kind", ["segments", "directory"])
def test_offloaded_decode_and_verify_graphs_give_the_unfolded_tokens(path, kind: str, monkeypatch) -> None:
    """Decode and MTP verify graphs under offload read the folded tables (their tails made in the warm-up) and
    decode what the same engine decodes with the shared expert in its own launches."""
    prompt = [int(t) for t in np.random.default_rng(96).integers(3, 500, size=30)]

    def run(depth: int) -> tuple[list[int], Engine]:
        cfg = OffloadConfig(cache_slots=12, prefill_ubatch=16, decode_graph=kind, decode_batch=1 + depth)
        engine = Engine.load(path, EngineConfig(n_ctx=256, ubatch=16, offload=cfg), ops=CudaOps())
        draft = DraftConfig("mtp", depth, adaptive=False) if depth else None
        return engine.generate(prompt, 40, GREEDY, ignore_eos=True, draft=draft).run().tokens, engine

    folded = {depth: run(depth) for depth in (0, 2)}
    for tokens, engine in folded.values():
        graphs = [g for g in engine.ops._decode_graphs.values() if g.captured]
        tables = [t for g in graphs for t in (g.tables if kind == "segments" else g.pairs).values()]
        assert graphs and tables and all(t.tail is not None for t in tables)
    monkeypatch.setattr(CudaOps, "fold_tail", lambda self, w: None)
    for depth, (tokens, _) in folded.items():
        assert tokens == run(depth)[0] and len(set(tokens)) > 8, f"depth {depth}"


def test_the_residual_added_by_combine_gives_the_bits_of_adding_it_after(path) -> None:
    """ops.moe(..., residual=r): r + the experts' sum, added last by combine at decode sizes (one launch fewer a
    layer), with the bits of adding it afterwards; prompt sizes (9 rows) add it after as before."""
    engine = Engine.load(path, EngineConfig(n_ctx=64), ops=CudaOps())
    ops, cfg = engine.ops, engine.model_config
    layers = [lw.ffn for lw in engine.model.weights.layers if isinstance(lw.ffn, MoEWeights)]
    rng = np.random.default_rng(97)
    for rows in (1, 3, 8, 9):
        x = cp.asarray(rng.standard_normal((rows, cfg.n_embd)).astype(np.float32))
        r = cp.asarray(rng.standard_normal((rows, cfg.n_embd)).astype(np.float32))
        for w in layers:
            ids, weights = ops.route(ops.linear(x, w.router), w.probs_bias, cfg)
            for with_shared in (False, True):
                got = ops.moe(x, ids, weights, w, with_shared=with_shared, residual=r)
                want = r + ops.moe(x, ids, weights, w, with_shared=with_shared)
                np.testing.assert_array_equal(cp.asnumpy(got), cp.asnumpy(want),
                                              err_msg=f"{rows} rows, {w.router.name}, shared {with_shared}")
