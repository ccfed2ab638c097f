"""DirectoryDecodeGraph.PREFETCH_DEPTH on the GPU: guesses a layer ahead change which experts the cache holds,
never a token. Greedy decoding under offload's directory graphs, plain and with MTP verify batches, gives the
tokens it gives without prefetching, and the cache counts prefetched experts. The prefetch mode's choices are
held to the numpy twin on the CPU (tests/test_slot_directory_transliteration.py)."""

from __future__ import annotations

import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

from runner.backends.cuda.ops import CudaOps  # noqa: E402
from runner.backends.cuda.token_graph import DirectoryDecodeGraph  # noqa: E402
from runner.engine.engine import Engine, EngineConfig  # noqa: E402
from runner.engine.sampling import SamplingParams  # noqa: E402
from runner.offload.offload import OffloadConfig  # noqa: E402
from runner.spec.config import DraftConfig  # noqa: E402

PROMPT = [7, 93, 411, 250, 18, 333, 64, 120, 5, 499, 77, 201]


@pytest.mark.parametrize("depth", [0, 2])
def test_prefetching_a_layer_ahead_keeps_the_tokens(synth_model, depth: int, monkeypatch: pytest.MonkeyPatch) -> None:
    path = synth_model("glm4moe", "Q4_K_M", preset="small", seed=77, direct=True)  # 16 experts, top-4

    def run(prefetch: int) -> tuple[list[int], dict]:
        monkeypatch.setattr(DirectoryDecodeGraph, "PREFETCH_DEPTH", prefetch)
        config = EngineConfig(n_ctx=512, ubatch=64, offload=OffloadConfig(cache_slots=12, decode_batch=3,
                                                                            transaction="always"))
        engine = Engine.load(path, config, ops=CudaOps())
        draft = DraftConfig("mtp", depth, adaptive=False) if depth else None
        gen = engine.generate(PROMPT, 96, SamplingParams(temperature=0.0), ignore_eos=True, draft=draft).run()
        return gen.tokens, engine.stats()["cache"]

    plain, plain_cache = run(0)
    tokens, cache = run(2)
    assert tokens == plain
    assert plain_cache["total"]["prefetched"] == 0 and cache["total"]["prefetched"] > 0
