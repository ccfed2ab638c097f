"""End to end on the CUDA backend: `runner generate --backend cuda` against `--backend numpy`, and
MTP drafting staying lossless when its verify batches run on the GPU kernels.

Fresh models (seeds 71..73) that no other test uses; quantized files carry random blocks (synth
`direct=True`), so the GPU box needs no llama.cpp.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

from test_speculative_greedy import ScriptedDrafter  # noqa: E402

from runner.backends.cuda.ops import CudaOps  # noqa: E402
from runner.cli.main import main  # noqa: E402
from runner.engine.engine import Engine, EngineConfig  # noqa: E402
from runner.engine.sampling import SamplingParams  # noqa: E402
from runner.spec.config import DraftConfig  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
PROMPT = [7, 93, 411, 250, 18, 333, 64, 120, 5, 499, 77, 201]


def generate_json(path, backend: str, prompt: str, n: int) -> dict:
    result = CliRunner().invoke(main, ["generate", str(path), "-p", prompt, "-n", str(n), "--temperature", "0",
                                       "--ignore-eos", "--n-ctx", "512", "--ubatch", "64", "--json",
                                       "--backend", backend])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


@pytest.mark.parametrize("arch,quant,seed", [("glm4moe", "Q4_K_M", 71), ("qwen3moe", "Q8_0", 72), ("glm4moe", "F32", 73)])
def test_generate_gives_the_same_greedy_tokens_on_both_backends(synth_model, arch: str, quant: str, seed: int) -> None:
    path = synth_model(arch, quant, seed=seed, direct=quant != "F32")
    prompt = "The quick brown fox jumps over the lazy dog, and then " * 3  # > 8 tokens: the GEMM prefill path too
    gpu, cpu = generate_json(path, "cuda", prompt, 48), generate_json(path, "numpy", prompt, 48)
    assert (gpu["backend"], cpu["backend"]) == ("cuda", "numpy")
    assert gpu["prompt_token_ids"] == cpu["prompt_token_ids"] and len(cpu["prompt_token_ids"]) > 8
    assert gpu["tokens"] == cpu["tokens"]
    assert len(set(cpu["tokens"])) > 8  # a diverse continuation, not a fixed point


@pytest.fixture(scope="module")
def drafting_model(synth_model):
    path = synth_model("glm4moe", "Q4_K_M", seed=74, direct=True)
    reference = _engine(path).generate(PROMPT, 200, GREEDY, ignore_eos=True).run().tokens
    return path, reference


def _engine(path) -> Engine:
    return Engine.load(path, EngineConfig(n_ctx=512, ubatch=64), ops=CudaOps())


@pytest.mark.parametrize("depth", [1, 3])
def test_mtp_drafting_on_cuda_is_lossless(drafting_model, depth: int) -> None:
    """Verify batches of depth + 1 rows replay their CUDA graph, and the output is plain decoding's."""
    path, reference = drafting_model
    engine = _engine(path)
    gen = engine.generate(PROMPT, 200, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", depth, adaptive=False)).run()
    assert gen.tokens == reference
    assert gen.draft.verify_steps > 0
    graph = engine.ops.decode_graph(engine.kv, depth + 1)
    assert graph is not None and graph.replays > gen.draft.verify_steps // 2


def test_oracle_drafts_on_cuda_are_all_accepted_and_lossless(drafting_model) -> None:
    path, reference = drafting_model
    engine = _engine(path)
    engine.drafter = ScriptedDrafter(engine, lambda i: reference[i])
    gen = engine.generate(PROMPT, 200, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 3, adaptive=False)).run()
    assert gen.tokens == reference
    assert gen.draft.acceptance == 1.0 and gen.draft.tokens_per_verify > 3.9
    assert engine.ops.decode_graph(engine.kv, 4).replays > 40  # about 50 verify batches of 4 rows


@pytest.mark.parametrize("offload", [False, True])
def test_depth_zero_replays_the_decode_graph_and_stays_lossless(drafting_model, offload: bool) -> None:
    """Always-wrong drafts drive adaptive depth to 0; those one-token verify steps replay the decode
    graph (whole-step resident, segmented under offload), the deeper steps before them the verify graphs
    of their row counts, and the output is still plain decoding's."""
    from runner.offload.offload import OffloadConfig

    path, reference = drafting_model
    config = EngineConfig(n_ctx=512, ubatch=64,
                          offload=OffloadConfig(cache_slots=8, decode_batch=4, transaction="always") if offload else None)
    engine = Engine.load(path, config, ops=CudaOps())
    n_vocab = engine.model_config.n_vocab
    engine.drafter = ScriptedDrafter(engine, lambda i: (reference[i] + 1) % n_vocab)
    gen = engine.generate(PROMPT, 120, GREEDY, ignore_eos=True, draft=DraftConfig("mtp", 3)).run()
    assert gen.tokens == reference[:120]
    assert engine.draft_stats()["draft_depth"] == 0
    graph = engine.ops.decode_graph(engine.kv)
    assert graph is not None and graph.replays > 50
    verify_graphs = [engine.ops.decode_graph(engine.kv, rows) for rows in (2, 3, 4)]
    assert verify_graphs[-1] is not None  # the first steps ran at depth 3
    assert all(type(g) is type(graph) for g in verify_graphs if g is not None)


@pytest.mark.parametrize("offload", [False, True])
def test_greedy_on_the_device_gives_plain_decodings_tokens(drafting_model, offload: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Engine.GREEDY_ON_DEVICE: the decode graph's logits row never leaves the GPU (cuda/greedy.cu picks the
    token), resident and under offload's directory graphs, and the tokens are plain decoding's."""
    from runner.offload.offload import OffloadConfig

    path, reference = drafting_model
    monkeypatch.setattr(Engine, "GREEDY_ON_DEVICE", True)
    config = EngineConfig(n_ctx=512, ubatch=64,
                          offload=OffloadConfig(cache_slots=8, transaction="always") if offload else None)
    engine = Engine.load(path, config, ops=CudaOps())
    downloads = []
    to_host = engine.ops.to_host
    monkeypatch.setattr(engine.ops, "to_host", lambda x: downloads.append(x.size) or to_host(x))
    assert engine.generate(PROMPT, 200, GREEDY, ignore_eos=True).run().tokens == reference
    assert downloads.count(engine.model_config.n_vocab) <= 1  # the prompt's row; no decode step's
