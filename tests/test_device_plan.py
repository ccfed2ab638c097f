"""--devices: the layer split's balance, its one-line refusals, and the device ids' checks."""

from __future__ import annotations

import pytest

from runner.backends.budget import GIB
from runner.errors import DeviceMemoryError, ProfileError
from runner.gguf_file import open_gguf
from runner.launch.devices import (
    LayerBytes,
    PlanCosts,
    parse_devices,
    plan_costs,
    plan_devices,
)
from runner.models.config import model_config


def _costs(n: int, per_layer: int, embedding: int = 0, head: int = 0, workspace: int = 0) -> PlanCosts:
    return PlanCosts(tuple(LayerBytes(per_layer, 0, 0) for _ in range(n)), embedding, head, workspace)


def test_equal_layers_split_in_half_and_the_summary_names_each_range() -> None:
    plan = plan_devices([0, 1], [24 * GIB, 24 * GIB], _costs(48, GIB // 4))
    assert [(s.first, s.last) for s in plan.shares] == [(0, 23), (24, 47)]
    assert plan.summary().startswith("layers 0-23 on cuda:0 (6.00 GiB of 24.00 GiB), 24-47 on cuda:1")
    assert plan.boundaries == (24,)
    assert plan.device_index(23) == 0 and plan.device_index(24) == 1


def test_the_embedding_and_head_pull_the_cut_toward_the_lighter_side() -> None:
    # the first card carries a 3-layer embedding: it takes fewer layers so both hold the same bytes
    plan = plan_devices([0, 1], [GIB, GIB], _costs(10, 10, embedding=40))
    first, second = plan.shares
    assert (first.last, second.first) == (2, 3)
    assert first.used_bytes == 70 and second.used_bytes == 70
    plan = plan_devices([0, 1], [GIB, GIB], _costs(10, 10, head=40))
    assert plan.shares[0].used_bytes == plan.shares[1].used_bytes == 70


def test_uneven_budgets_get_layers_in_proportion() -> None:
    plan = plan_devices([0, 1], [3 * GIB, GIB], _costs(8, GIB // 2))
    assert [(s.first, s.last) for s in plan.shares] == [(0, 5), (6, 7)]
    assert all(s.used_bytes <= s.budget_bytes for s in plan.shares)


def test_a_model_too_big_for_two_cards_is_one_line() -> None:
    with pytest.raises(DeviceMemoryError) as err:
        plan_devices([0, 1], [GIB, GIB], _costs(4, GIB, workspace=1))
    assert "2 cards of 1.00 GiB cannot hold" in str(err.value) and "\n" not in str(err.value)


def test_more_cards_than_layers_is_refused() -> None:
    with pytest.raises(DeviceMemoryError, match="at most 2"):
        plan_devices([0, 1, 2], [GIB] * 3, _costs(2, 1))


def test_a_real_file_counts_every_tensor_once(synth_model) -> None:
    f = open_gguf(synth_model("glm4moe", "Q8_0"))
    cfg = model_config(f)
    every = sum(t.nbytes for t in f.tensors.values())
    resident = plan_costs(f, cfg, 128, None, 0)
    assert sum(layer.weights for layer in resident.layers) + resident.embedding + resident.head >= every
    offloaded = plan_costs(f, cfg, 128, 2, 0)
    assert sum(layer.slots for layer in offloaded.layers) > 0
    assert sum(layer.weights for layer in offloaded.layers) < sum(layer.weights for layer in resident.layers)
    assert {layer.kv for layer in resident.layers} == {2 * 128 * cfg.n_head_kv * cfg.head_dim * 2}  # f16 K/V
    f32 = plan_costs(f, cfg, 128, None, 0, kv_type="f32")
    assert {layer.kv for layer in f32.layers} == {2 * 128 * cfg.n_head_kv * cfg.head_dim * 4}


@pytest.mark.parametrize("text, message", [
    ("0,0", "device 0 is named twice"),
    ("0,-1", "device id -1 is negative"),
    ("0,2", "device 2 does not exist; the backend sees 2 devices"),
    ("zero", "comma-separated device ids"),
    ("", "comma-separated device ids"),
])
def test_bad_device_lists_are_one_line_each(text: str, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        parse_devices(text, visible=2)


def test_good_device_lists_keep_their_order() -> None:
    assert parse_devices("1, 0", visible=2) == (1, 0)
    assert parse_devices("3") == (3,)


def _seed_costs(n_ctx: int, slots: int) -> PlanCosts:
    """The 48-layer seed shape (Q4_K_M, as home-24g was qualified on), sized without writing its 48 GB."""
    from types import SimpleNamespace

    from runner.models.config import ModelConfig
    from runner.offload.sizing import decode_workspace_bytes
    from runner.synth.mixes import mix_qtype
    from runner.synth.presets import PRESETS
    from runner.synth.writer import stored_nbytes, tensor_plan

    s = PRESETS["glm4moe"]["seed"]
    n_all = s.n_layer + s.n_nextn
    tensors = {t.name: SimpleNamespace(name=t.name, shape=t.shape,
                                       nbytes=stored_nbytes(t.shape, mix_qtype("Q4_K_M", t.name, n_all, shape=t.shape)))
               for t in tensor_plan("glm4moe", s)}
    cfg = ModelConfig(arch="glm4moe", n_vocab=s.n_vocab, n_embd=s.n_embd, n_layer=s.n_layer, n_nextn=s.n_nextn,
                      n_head=s.n_head, n_head_kv=s.n_head_kv, head_dim=s.head_dim, n_rot=s.n_rot,
                      rope_base=s.rope_base, rms_eps=1e-6, n_ctx_train=s.n_ctx, n_ff=s.n_ff, n_expert=s.n_expert,
                      n_expert_used=s.n_expert_used, n_ff_exp=s.n_ff_exp, n_expert_shared=1, n_dense_lead=1,
                      gating="sigmoid", expert_weights_norm=True, expert_weights_scale=1.0, n_expert_groups=0,
                      n_group_used=0, n_ff_shexp=s.n_ff_exp)
    return plan_costs(SimpleNamespace(tensors=tensors), cfg, n_ctx, slots, decode_workspace_bytes(cfg))


def test_the_seed_shape_past_one_24g_card_splits_evenly_over_two() -> None:
    # 300 slots per layer (twice home-24g's 150) at a 64k context: more than one 24 GiB card holds
    costs = _seed_costs(65536, 300)
    with pytest.raises(DeviceMemoryError, match="1 card of 24.00 GiB cannot hold"):
        plan_devices([0], [24 * GIB], costs)
    plan = plan_devices([0, 1], [24 * GIB, 24 * GIB], costs)
    first, second = plan.shares
    assert (first.first, second.last) == (0, 47) and first.last + 1 == second.first
    assert 20 <= second.first <= 28  # the head and NextN block weigh a little more than the embedding
    assert all(s.used_bytes <= 24 * GIB for s in plan.shares)
    assert abs(first.used_bytes - second.used_bytes) < 2 * max(layer.total for layer in costs.layers)
