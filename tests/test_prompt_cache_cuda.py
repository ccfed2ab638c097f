"""The host-RAM prompt cache on the CUDA backend: switching conversations A, B, A uploads A's saved K/V
back into the device cache (Ops.from_host) and continues with the bits of an engine that never left A,
all experts resident and under expert offload, with K/V cached as f16 (the default) or f32."""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

from test_prompt_cache import A, B, GREEDY, MORE, Recorder  # noqa: E402

from runner.backends.budget import GIB, DeviceBudget  # noqa: E402
from runner.backends.cuda.ops import CudaOps  # noqa: E402
from runner.engine.engine import Engine, EngineConfig  # noqa: E402
from runner.offload.offload import OffloadConfig  # noqa: E402


def _load(path, cache_bytes: int, offload: OffloadConfig | None, kv_type: str = "f16") -> Engine:
    ops = CudaOps(DeviceBudget(2 * GIB), kv_type=kv_type) if offload else CudaOps(kv_type=kv_type)
    return Engine.load(path, EngineConfig(n_ctx=128, ubatch=8, prompt_cache_bytes=cache_bytes, offload=offload), ops=ops)


@pytest.mark.parametrize("kv_type", ["f16", "f32"])
@pytest.mark.parametrize("offloaded", [False, True])
def test_switching_back_restores_on_the_device(synth_model, offloaded: bool, kv_type: str) -> None:
    path = synth_model("glm4moe", "Q8_0")
    offload = OffloadConfig(cache_slots=3, prefill_ubatch=8, transaction="always") if offloaded else None
    engine = _load(path, GIB, offload, kv_type)
    first = engine.generate(A, 6, GREEDY, ignore_eos=True).run()
    engine.generate(B, 6, GREEDY, ignore_eos=True).run()
    follow_up = A + first.tokens[:-1] + MORE
    recorder = Recorder(engine)
    third = engine.generate(follow_up, 6, GREEDY, ignore_eos=True).run()
    assert third.restored_tokens == len(A) + len(first.tokens) - 1
    assert recorder.rows[0] == len(MORE)

    saved = next(iter(engine.prompt_cache.entries.values())).trunk
    assert {a.dtype.name for a in saved.k} == {"float16" if kv_type == "f16" else "float32"}
    alone = _load(path, 0, offload, kv_type)
    alone.generate(A, 6, GREEDY, ignore_eos=True).run()
    fresh = Recorder(alone)
    again = alone.generate(follow_up, 6, GREEDY, ignore_eos=True).run()
    assert again.tokens == third.tokens
    assert len(recorder.logits) == len(fresh.logits)
    for got, want in zip(recorder.logits, fresh.logits):
        assert np.array_equal(got, want)
