"""Draft steps of the NextN block replayed from CUDA graphs (CudaOps.draft_forward, runner/backends/cuda/
draft_graph.py): the bits of the eager block, resident and under expert offload, across rollbacks, and MTP
generation that replays them and stays plain decoding's.

Fresh models (seeds 75, 76) that no other test uses. Each engine is built and run to the end before the
next one is built, as in test_decode_segments_cuda.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

from runner.backends.budget import GIB, DeviceBudget  # noqa: E402
from runner.backends.cuda.decode_graph import DecodeGraph  # noqa: E402
from runner.backends.cuda.decode_segments import SegmentedDecodeGraph  # noqa: E402
from runner.backends.cuda.ops import CudaOps  # noqa: E402
from runner.backends.cuda.token_graph import DirectoryDecodeGraph  # noqa: E402
from runner.engine.engine import Engine, EngineConfig  # noqa: E402
from runner.engine.sampling import SamplingParams  # noqa: E402
from runner.offload.offload import OffloadConfig  # noqa: E402
from runner.spec.config import DraftConfig  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
PROMPT = [7, 93, 411, 250, 18, 333, 64, 120, 5, 499, 77, 201, 42, 310, 9, 87, 150, 222, 61, 400]
UBATCH = 16


@pytest.fixture(scope="module")
def tiny(synth_model):
    return synth_model("glm4moe", "Q4_K_M", seed=75, direct=True)


@pytest.fixture(scope="module")
def small(synth_model):
    """16 experts top-4 per MoE layer: 12 slots hold 3 rows' experts and still miss."""
    return synth_model("glm4moe", "Q4_K_M", preset="small", seed=76, direct=True)


def _offload(graph: str = "directory") -> OffloadConfig:
    return OffloadConfig(cache_slots=12, decode_batch=3, prefill_ubatch=UBATCH, transaction="always", decode_graph=graph)


def _draft_steps(engine: Engine, sizes: list[int]) -> tuple[list[np.ndarray], object]:
    """ops.draft_forward over the trunk's hidden rows of PROMPT in batches of `sizes` rows, each batch's last
    hidden row fed back once as a 1-row recursion step, and a rollback of that entry (as a draft does);
    every step's logits and hidden rows on the host, and the NextN cache."""
    hidden_chunks: list[np.ndarray] = []
    engine.prefill(PROMPT, on_hidden=lambda start, h: hidden_chunks.append(h.copy()))
    trunk = engine.ops.concat_rows(hidden_chunks)
    block, ops = engine.nextn[0], engine.ops
    kv = block.new_kv_cache(engine.n_ctx)
    out, at, rng = [], 0, np.random.default_rng(7)
    for rows in sizes:
        tokens = np.asarray(PROMPT[at + 1 : at + 1 + rows])
        logits, hidden = ops.draft_forward(block, trunk[at : at + rows], tokens, kv, engine.step)
        out += [ops.to_host(logits), ops.to_host(hidden)]
        at += rows
        n_trunk = kv.n_tokens
        kv.checkpoint()
        logits, hidden = ops.draft_forward(block, hidden[-1:], np.asarray([int(rng.integers(3, 500))]), kv,
                                           engine.step)
        out += [ops.to_host(logits), ops.to_host(hidden)]
        kv.rollback(n_trunk)
    return out, kv


def _assert_draft_graphs_give_the_eager_bits(path, config: EngineConfig, sizes: list[int], kind: type) -> None:
    runs = []
    for graphs in (False, True):
        engine = Engine.load(path, config, ops=CudaOps(DeviceBudget(2 * GIB), graphs=graphs))
        out, kv = _draft_steps(engine, sizes)
        stats = engine.stats()
        if graphs:
            seen = {rows: engine.ops.draft_graph(kv, rows) for rows in set(sizes) | {1}}
            n_layer = engine.model_config.n_layer
        runs.append((out, stats))
        del engine, kv
    (eager, eager_stats), (replayed, stats) = runs
    assert len(eager) == len(replayed) and all(np.array_equal(a, b) for a, b in zip(eager, replayed))
    assert stats.get("cache") == eager_stats.get("cache")  # under offload: the same hits, misses and evictions
    for rows, graph in seen.items():
        assert type(graph) is kind and graph.rows == rows
        uses = sizes.count(rows) + (len(sizes) if rows == 1 else 0)
        # A warm-up step, then replays; the segmented graph's capturing step runs its segments eagerly and is
        # not one, DecodeGraph's (and the directory graph's) captures and launches at once (test_decode_segments*.py
        # count the same way).
        assert graph.replays == uses - (2 if kind is SegmentedDecodeGraph else 1)
        if kind is SegmentedDecodeGraph:
            assert list(graph.tables) == [n_layer]  # the block's MoE layer, blk.n_layer, through the provider


def test_resident_draft_graphs_give_the_eager_blocks_bits(tiny) -> None:
    sizes = [1, 2, 3, 4, 2, 4, 1, 2]  # 19 rows: the prompt's last waits for the token after it
    _assert_draft_graphs_give_the_eager_bits(tiny, EngineConfig(n_ctx=256, ubatch=UBATCH), sizes, DecodeGraph)


@pytest.mark.parametrize("graph,kind", [("segments", SegmentedDecodeGraph), ("directory", DirectoryDecodeGraph)])
def test_offloaded_draft_graphs_give_the_eager_blocks_bits_with_the_same_cache_traffic(small, graph: str,
                                                                                     kind: type) -> None:
    sizes = [1, 2, 3, 3, 2, 1, 3, 2, 1, 1]  # 19 rows
    config = EngineConfig(n_ctx=256, ubatch=UBATCH, offload=_offload(graph))
    _assert_draft_graphs_give_the_eager_bits(small, config, sizes, kind)


@pytest.mark.parametrize("offload", [False, True])
def test_mtp_replays_its_draft_graphs_and_stays_lossless(small, offload: bool) -> None:
    config = EngineConfig(n_ctx=512, ubatch=UBATCH, offload=_offload() if offload else None)
    reference = Engine.load(small, config, ops=CudaOps(DeviceBudget(2 * GIB))).generate(
        PROMPT, 120, GREEDY, ignore_eos=True).run().tokens
    engine = Engine.load(small, config, ops=CudaOps(DeviceBudget(2 * GIB)))
    gen = engine.generate(PROMPT, 120, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 2, adaptive=False)).run()
    assert gen.tokens == reference and gen.draft.verify_steps > 10
    kv = engine.drafter.kv
    one = engine.ops.draft_graph(kv, 1)
    assert one is not None and one.replays > gen.draft.verify_steps // 2  # the recursion step of every draft
    kind = DirectoryDecodeGraph if offload else DecodeGraph  # directory graphs: offload's default
    assert all(type(g) is kind for g in (engine.ops.draft_graph(kv, rows) for rows in (1, 2, 3, 4)) if g is not None)
