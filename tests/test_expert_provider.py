"""The expert seam: ops.moe computes each expert from exactly the bytes its provider returned."""

from __future__ import annotations

import numpy as np

from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.offload.provider import ResidentExperts, experts_by_recency, moe_layer_index


class Swapped(ResidentExperts):
    """Serves expert 0's bytes when asked for expert 1 (a wrong slot mapping)."""

    def fetch(self, w, experts):
        got = dict(super().fetch(w, experts))
        if 1 in got:
            got[1] = super().fetch(w, [0])[0]
        return got


class Recording(ResidentExperts):
    def __init__(self) -> None:
        self.calls: list[tuple[int, list[int]]] = []

    def fetch(self, w, experts):
        self.calls.append((moe_layer_index(w), list(experts)))
        return super().fetch(w, experts)


def test_experts_are_ordered_last_token_first() -> None:
    assert experts_by_recency(np.array([[3, 1], [2, 3], [5, 4]])) == [5, 4, 2, 3, 1]


def test_a_prompts_experts_by_recency_match_a_sort_of_every_pair() -> None:
    """Prompt-sized ids (int64 and the device's int32) take numpy's path; an expert only the first token names
    comes last."""
    rng = np.random.default_rng(5)
    for tokens, n_expert, dtype in ((8192, 512, np.int32), (3000, 128, np.int64), (500, 512, np.int32),
                                    (20000, 16, np.int64), (7, 512, np.int32)):
        ids = rng.integers(0, n_expert - 1, (tokens, 10)).astype(dtype)
        ids[0, 9] = n_expert - 1  # named by the first token only, at its last rank
        flat = ids[::-1].reshape(-1)
        experts, first = np.unique(flat, return_index=True)
        expected = experts[np.argsort(first, kind="stable")].tolist()
        assert experts_by_recency(ids) == expected and expected[-1] == n_expert - 1


def test_moe_asks_the_provider_once_per_moe_layer_with_the_batch_experts(synth_model) -> None:
    rec = Recording()
    engine = Engine.load(synth_model("glm4moe"), EngineConfig(n_ctx=64), experts=rec)
    engine.prefill(list(range(20, 30)))
    assert [layer for layer, _ in rec.calls] == [1, 2]  # blk.0 is the leading dense layer
    assert all(len(set(e)) == len(e) <= 8 for _, e in rec.calls)


def test_wrong_expert_bytes_change_the_output_even_after_the_right_ones_were_cached(synth_model) -> None:
    path, tokens = synth_model("qwen3moe"), list(range(40, 60))
    ops = NumpyOps()
    right = Engine.load(path, EngineConfig(n_ctx=64), ops=ops).logits_all(tokens)
    # same ops, same dequant cache: the swap must still show
    wrong = Engine.load(path, EngineConfig(n_ctx=64), ops=ops, experts=Swapped()).logits_all(tokens)
    assert not np.allclose(right, wrong, atol=1e-3)
