"""The CUDA backend on the files llama.cpp's quantizer wrote (tests/data/iq/, see test_llama_quantized_iq.py).

Against the numpy reference on the same bytes (float32 both sides: logits within 1e-4 x their std,
test_grid_types_cuda.py's bound) and against llama.cpp's greedy continuation as manifest.json recorded
it: teacher-forced on it, the GPU's argmax is llama.cpp's token wherever llama.cpp's top-2 margin is clear
(float32 activations differ from llama.cpp's Q8_K-rounded ones by ~0.1-0.4 logits, test_llama_parity.py
says why). The GPU box has no llama.cpp, so nothing here imports it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

from runner.backends.cuda.ops import CudaOps  # noqa: E402
from runner.backends.numpy.ops import NumpyOps  # noqa: E402
from runner.engine.engine import Engine, EngineConfig  # noqa: E402

DATA = Path(__file__).parent / "data" / "iq"
FIXTURES = json.loads((DATA / "manifest.json").read_text())["fixtures"]
NEAR_TIE = 0.5  # logits: test_llama_parity.py's


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_cuda_backend_matches_numpy_and_llama_cpp_tokens(name: str) -> None:
    fx = FIXTURES[name]
    path, tokens = DATA / fx["file"], fx["prompt_tokens"] + fx["llama_greedy"]
    config = EngineConfig(n_ctx=256, ubatch=7)
    want = Engine.load(path, config, ops=NumpyOps(kv_type="f32")).logits_all(tokens)
    got = Engine.load(path, config, ops=CudaOps(prefill_precision="f32", kv_type="f32")).logits_all(tokens)
    assert np.abs(got - want).max() <= 1e-4 * float(np.std(want))
    chosen = got[len(fx["prompt_tokens"]) - 1 : -1].argmax(-1)  # [N_GREEDY]
    clear = np.asarray(fx["llama_top2_margin"]) >= NEAR_TIE
    differs = clear & (chosen != np.asarray(fx["llama_greedy"]))
    assert not differs.any(), f"argmax is not llama.cpp's token at clear positions {np.nonzero(differs)[0].tolist()}"
