"""Programmatic dependent launch on the GPU (runner/backends/cuda/launch.py): with launch.PDL on, kernels of
PDL_MODULES start before the kernel ahead of them ends and wait inside (cuda/pdl.cuh). Nothing may change but the
timing: a chain of kernels that each read the one before, eager and captured in a graph, gives the bits it gives
without PDL, and so does decoding, resident and under offload's graphs, with every launch of PDL_MODULES going
through cuLaunchKernelEx."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda import launch  # noqa: E402
from runner.backends.cuda.gemv import gemv, gemv_multi  # noqa: E402
from runner.backends.cuda.norm_rope import add, rms_norm  # noqa: E402
from runner.backends.cuda.ops import CudaOps  # noqa: E402
from runner.engine.engine import Engine, EngineConfig  # noqa: E402
from runner.engine.sampling import SamplingParams  # noqa: E402
from runner.offload.offload import OffloadConfig  # noqa: E402
from runner.synth.random_blocks import random_tensor  # noqa: E402

K = 2048
STEPS = 24


def _matrix(rng: np.random.Generator, n: int) -> cp.ndarray:
    data = random_tensor(rng, QT.Q4_K, (n, K), 0.02)
    return cp.asarray(np.ascontiguousarray(data).view(np.uint8).reshape(n, -1))


def _chain(x: cp.ndarray, w: cp.ndarray, w3: tuple, norm_w: cp.ndarray) -> cp.ndarray:
    """STEPS rounds of norm -> product -> residual add -> three products at once: every kernel reads the last."""
    for _ in range(STEPS):
        h = gemv(rms_norm(x, norm_w, 1e-6), w, QT.Q4_K, K)
        x = add(x, h)
        a, b, c = gemv_multi(x, [(m, QT.Q4_K) for m in w3], [None] * 3)
        x = add(add(a, b), c)
    return x


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_a_chain_of_dependent_kernels_gives_the_same_bits_with_pdl(monkeypatch, graph: bool) -> None:
    rng = np.random.default_rng(5)
    w, w3 = _matrix(rng, K), tuple(_matrix(rng, K) for _ in range(3))
    norm_w = cp.asarray(rng.uniform(0.5, 1.5, K).astype(np.float32))
    x0 = cp.asarray(rng.standard_normal((2, K)).astype(np.float32))
    got = {}
    for pdl in (False, True):
        monkeypatch.setattr(launch, "PDL", pdl)
        before = launch.counts.pdl
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            out = _chain(x0, w, w3, norm_w)  # eager, and the warm-up of the graph's kernels
            if graph:
                stream.begin_capture()
                out = _chain(x0, w, w3, norm_w)
                g = stream.end_capture()
                out.fill(0)
                g.launch(stream)
        stream.synchronize()
        got[pdl] = cp.asnumpy(out).view(np.uint32)
        assert (launch.counts.pdl > before) == pdl
    assert np.isfinite(got[False].view(np.float32)).all()
    assert np.array_equal(got[True], got[False])


GREEDY = SamplingParams(temperature=0.0)
KINDS = {"resident": None, "directory": "directory", "segments": "segments"}


@pytest.mark.parametrize("kind", list(KINDS))
def test_decoding_gives_the_same_tokens_with_pdl(monkeypatch, synth_model, kind: str) -> None:
    path = synth_model("glm4moe", "Q4_K_M", preset="small", seed=91, direct=True)
    prompt = [int(t) for t in np.random.default_rng(91).integers(3, 500, size=40)]
    got = {}
    for pdl in (False, True):
        monkeypatch.setattr(launch, "PDL", pdl)
        plain = launch.counts.plain
        offload = None if KINDS[kind] is None else OffloadConfig(cache_slots=4, prefill_ubatch=16,
                                                                 decode_graph=KINDS[kind], transaction="always")
        engine = Engine.load(path, EngineConfig(n_ctx=256, ubatch=16, offload=offload), ops=CudaOps())
        got[pdl] = engine.generate(prompt, 48, GREEDY, ignore_eos=True).run().tokens
        assert launch.counts.plain == plain, "a PDL module's launch fell back to CuPy (a Python scalar argument)"
        del engine
    assert got[True] == got[False]
