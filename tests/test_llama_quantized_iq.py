"""Files whose IQ and TQ blocks llama.cpp's own quantizer wrote, run by the runner against llama.cpp.

tests/data/iq/ holds tiny qwen3moe models that `llama-quantize` turned into each IQ file type and
TQ1_0/TQ2_0 (with an importance matrix from `llama-imatrix` where the type demands one), and a glm4moe
file with the nine types in as many tensor classes (scripts/make_iq_fixtures.py made them;
its manifest.json holds each file's tensor types and llama.cpp's greedy continuation). The numpy
reference must meet test_llama_parity.py's quantized-file bar on each: teacher-forced on llama.cpp's
greedy continuation, median deviation under 0.1 x the logits' std, argmax agreement at 95% of the
positions and at every clear one. test_llama_quantized_iq_cuda.py runs the CUDA backend on the same files.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import pytest
from test_llama_parity import assert_quantized_parity, compare, greedy, identical_prefix

from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.offload.offload import OffloadConfig

DATA = Path(__file__).parent / "data" / "iq"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
FIXTURES = MANIFEST["fixtures"]

# What each file must hold: tensor-name fragment -> type of every tensor whose name has it. Written here,
# not read from the manifest, so a file regenerated without its IQ blocks (or an F32 one) fails.
CLAIMED = {
    **{f"qwen3moe-{t}": {"_exps.": t} for t in ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ3_S", "TQ1_0",
                                               "TQ2_0")},
    "qwen3moe-IQ2_M": {"_exps.": "IQ2_S"},  # llama.cpp's IQ2_M file type is the one of IQ2_S tensors
    "glm4moe-mix": {"ffn_gate_exps": "IQ1_S", "ffn_up_exps": "IQ1_M", "ffn_down_exps": "IQ2_XS",
                   "ffn_gate_shexp": "IQ2_S", "ffn_up_shexp": "TQ1_0", "ffn_down_shexp": "TQ2_0",
                   "attn_q.weight": "IQ3_XXS", "attn_output": "IQ3_S", "blk.0.ffn_gate.": "IQ2_XXS"},
}
NAMES = sorted(CLAIMED)


def fixture_path(name: str) -> Path:
    return DATA / FIXTURES[name]["file"]


@pytest.mark.parametrize("name", NAMES)
def test_file_holds_the_claimed_tensor_types(name: str) -> None:
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(fixture_path(name)).tensors}
    for fragment, want in CLAIMED[name].items():
        matched = {n: t for n, t in types.items() if fragment in n}
        assert matched and set(matched.values()) == {want}, f"{fragment}: {matched}"
    matrices = [n for n in types if n.endswith(".weight") and "norm" not in n and "ffn_gate_inp" not in n]
    assert not {types[n] for n in matrices} & {"F32", "F16"}, "a matrix is not quantized"
    assert Counter(types.values()) == FIXTURES[name]["tensor_types"]


@pytest.mark.parametrize("name", NAMES)
def test_numpy_reference_matches_llama_cpp(name: str, record_property) -> None:
    arch = FIXTURES[name]["arch"]
    got_logits, want_logits, got_tokens, want_tokens = compare(arch, fixture_path(name), record_property)
    assert want_tokens == FIXTURES[name]["llama_greedy"], "manifest.json is stale: llama.cpp continues otherwise"
    assert_quantized_parity(arch, got_logits, want_logits)
    record_property("greedy_tokens_identical_prefix", identical_prefix(got_tokens, want_tokens))


def test_offloaded_experts_give_the_resident_logits_and_tokens() -> None:
    path = fixture_path("glm4moe-mix")
    offload = OffloadConfig(cache_slots=2, prefill_ubatch=7, transaction="always")
    resident = Engine.load(path, EngineConfig(n_ctx=256, ubatch=7), ops=NumpyOps(llama_activations=True, kv_type="f32"))
    engine = Engine.load(path, EngineConfig(n_ctx=256, ubatch=7, offload=offload),
                         ops=NumpyOps(llama_activations=True, kv_type="f32"))
    prompt = FIXTURES["glm4moe-mix"]["prompt_tokens"]
    tokens = prompt + FIXTURES["glm4moe-mix"]["llama_greedy"]
    assert np.array_equal(engine.logits_all(tokens), resident.logits_all(tokens))
    assert greedy(engine, prompt, 16) == greedy(resident, prompt, 16)
    assert engine.stats()["cache"]["total"]["misses"] > 0  # the 2 slots of 4 experts really cycled
