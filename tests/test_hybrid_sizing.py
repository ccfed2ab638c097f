"""Offload and context sizing for the hybrid families (runner/offload/sizing.py, runner/launch/context.py):
K/V is per token in the gated-attention layers only (one in four, and the NextN block when it drafts),
and the DeltaNet layers hold a fixed-size state beside the weights, at most DEVICE_STATE_SETS copies of
it (hybrid_cache.py), whatever the context. The context default and `--cache-slots auto` follow."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from gguf_edit import rewrite_gguf

from runner.engine.engine import Engine, EngineConfig
from runner.engine.hybrid_cache import DEVICE_STATE_SETS, MAX_CHECKPOINTS
from runner.engine.sampling import SamplingParams
from runner.gguf_file import open_gguf
from runner.launch.context import AUTO_HEADROOM
from runner.launch.resolve import LaunchOptions, resolve
from runner.models.config import FAMILIES, ModelConfig, model_config
from runner.models.delta_net_config import DeltaNetConfig
from runner.offload.sizing import (
    attention_layers,
    delta_net_state_bytes,
    kv_bytes_per_token,
    kv_cache_bytes,
    recurrent_state_bytes,
    slot_bytes_all_layers,
)
from runner.synth.presets import PRESETS, SynthShape

MIB, GIB = 2**20, 2**30
CARD = {"backend": "numpy", "prefill_order": "per_microbatch", "prefill_ubatch": 16}


def _config(arch: str, s: SynthShape) -> ModelConfig:
    """The config a file of synth shape `s` reads as (the full-size presets are too big to write here)."""
    family = FAMILIES[arch]
    recurrent = tuple(s.is_recurrent(i) for i in range(s.n_layer))
    return ModelConfig(arch=arch, n_vocab=s.n_vocab, n_embd=s.n_embd, n_layer=s.n_layer, n_nextn=s.n_nextn,
                       n_head=s.n_head, n_head_kv=s.n_head_kv, head_dim=s.head_dim, n_rot=s.n_rot,
                       rope_base=s.rope_base, rms_eps=1e-6, n_ctx_train=s.n_ctx, n_ff=s.n_ff, n_expert=s.n_expert,
                       n_expert_used=s.n_expert_used, n_ff_exp=s.n_ff_exp, n_expert_shared=1, n_dense_lead=0,
                       gating="softmax", expert_weights_norm=True, expert_weights_scale=0.0, n_expert_groups=0,
                       n_group_used=0, n_ff_shexp=s.n_ff_shexp, rope_sections=s.rope_sections,
                       delta_net=DeltaNetConfig(s.ssm_conv_kernel, s.ssm_state, s.ssm_k_heads, s.ssm_v_heads,
                                                family.value_heads, recurrent))


@pytest.mark.parametrize(("arch", "preset", "attention", "state_mib", "kv_kib"), [  # kv_kib: K/V as f16
    # 40 layers, 10 of them attention (2 KV heads of 256); 30 DeltaNet layers of 32 value heads of 128
    ("qwen35moe", "qwen35-35b-a3b", 10, 30 * (3 * 8192 + 32 * 128 * 128) * 4 / MIB, 20),
    # 60 layers, 15 attention (2 KV heads of 256); 45 DeltaNet layers of 64 value heads of 128
    ("qwen35moe", "qwen35-397b-a17b", 15, 45 * (3 * 12288 + 64 * 128 * 128) * 4 / MIB, 30),
    ("qwen3next", "qwen3next-80b-a3b", 12, 36 * (3 * 8192 + 32 * 128 * 128) * 4 / MIB, 24),
])
def test_full_size_hybrids_count_k_v_in_their_attention_layers_and_a_fixed_delta_net_state(
        arch: str, preset: str, attention: int, state_mib: float, kv_kib: int) -> None:
    cfg = _config(arch, PRESETS[arch][preset])
    assert attention_layers(cfg) == attention == cfg.n_layer // 4
    assert kv_bytes_per_token(cfg, drafting=False) == kv_kib * 1024  # a quarter of what every layer would keep
    assert kv_bytes_per_token(cfg, drafting=True) == (kv_kib + kv_kib // attention) * 1024  # + the NextN block
    assert kv_bytes_per_token(cfg, False, "f32") == 2 * kv_kib * 1024  # the state stays float32 either way
    assert delta_net_state_bytes(cfg) / MIB == pytest.approx(state_mib)
    assert recurrent_state_bytes(cfg) == DEVICE_STATE_SETS * delta_net_state_bytes(cfg)
    assert kv_cache_bytes(cfg, 1000) == 1000 * kv_kib * 1024 + recurrent_state_bytes(cfg)
    # the models' whole 262144-token context of K/V: 5 / 7.5 / 6 GiB (f32: 10 / 15 / 12; every layer: 4x)
    assert kv_cache_bytes(cfg, cfg.n_ctx_train) - recurrent_state_bytes(cfg) == attention * GIB // 2
    assert kv_cache_bytes(cfg, cfg.n_ctx_train, "f32") - recurrent_state_bytes(cfg) == attention * GIB


def test_the_35b_shape_s_state_arithmetic() -> None:
    """62.8 MiB per copy of the 30 DeltaNet layers' state (the 2 MiB recurrent state of each dominates), 13
    copies: 816 MiB held whatever the context, as much as 41k tokens of its f16 K/V (20k at f32)."""
    cfg = _config("qwen35moe", PRESETS["qwen35moe"]["qwen35-35b-a3b"])
    assert delta_net_state_bytes(cfg) == 65_863_680
    assert DEVICE_STATE_SETS == 13 and recurrent_state_bytes(cfg) == 856_227_840
    assert recurrent_state_bytes(cfg) // kv_bytes_per_token(cfg, False) == 41_808
    assert recurrent_state_bytes(cfg) // kv_bytes_per_token(cfg, False, "f32") == 20_904


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen3next"])
def test_the_device_state_bound_holds_through_checkpoints_and_full_verify_batches(synth_model, arch: str) -> None:
    """The distinct state memory the cache references never passes recurrent_state_bytes: prompts, verify
    batches of SMALL_BATCH_ROWS rows (a row snapshot each), more checkpoints than it keeps."""
    engine = Engine.load(synth_model(arch), EngineConfig(n_ctx=256, ubatch=16))
    cache, cfg = engine.kv, engine.model_config
    assert delta_net_state_bytes(cfg) == 3 * (3 * 512 + 4 * 64 * 64) * 4  # the tiny shape's 3 DeltaNet layers
    peak = 0

    def held() -> int:
        arrays = [a for states in (cache.states, cache._advanced, *(s.states for s in cache.snapshots.values()))
                  for st in states for a in (st.conv, st.ssm)]
        bases = {id(a.base if a.base is not None else a): (a.base if a.base is not None else a) for a in arrays}
        return sum(b.nbytes for b in bases.values())

    engine.prefill(list(range(10, 50)))
    for round_ in range(MAX_CHECKPOINTS + 2):
        engine.verify([7 + round_, 8, 9, 10, 11, 12, 13, 14])  # 8 rows, each kept
        peak = max(peak, held())
        engine.rollback(engine.kv.n_tokens - 3)
        engine.decode(5)
    assert len([p for p, s in cache.snapshots.items() if s.from_checkpoint]) == MAX_CHECKPOINTS
    assert (DEVICE_STATE_SETS - 1) * delta_net_state_bytes(cfg) < peak <= recurrent_state_bytes(cfg)


@pytest.fixture(scope="module")
def long_hybrid(synth_model, tmp_path_factory):
    """The tiny qwen35moe (Q8_0: one attention layer of four, 0.5 KiB of f16 K/V per token) claiming 128k tokens."""
    return rewrite_gguf(synth_model("qwen35moe", "Q8_0"), tmp_path_factory.mktemp("ctx") / "hybrid-128k.gguf",
                        {"qwen35moe.context_length": 131072})


def test_the_default_context_of_a_hybrid_counts_its_attention_layers_beside_its_state(long_hybrid) -> None:
    f = open_gguf(long_hybrid)
    cfg = model_config(f)
    plan = resolve(LaunchOptions(**CARD, cache_slots="6", vram_budget_gib=0.05), f)
    state = recurrent_state_bytes(cfg)
    assert kv_bytes_per_token(cfg, False) == 512 and state == 13 * 3 * 17920 * 4
    assert "leaves the KV cache and decode attention partials at 0.6 KiB per token beside resident weights" \
        in plan.context.why
    assert "DeltaNet state (13 copies) 2.7 MiB" in plan.context.why
    engine = Engine(f, plan.engine_config())  # the emulated card holds the K/V, the state, slots and buffers
    held = engine.offload.budget.held
    assert held["kv cache"] == plan.n_ctx * 512 + state
    free_at_default = engine.offload.budget.limit_bytes - sum(held.values())
    assert 0 <= free_at_default < int(AUTO_HEADROOM * engine.offload.budget.limit_bytes) + 256 * 1024
    every_layer = 2 * cfg.n_layer * cfg.n_head_kv * cfg.head_dim * 2  # what was counted before: 2 KiB per token
    assert plan.n_ctx > 3.5 * ((plan.n_ctx * 512 + state) // every_layer)  # the same bytes held 1/4 the tokens
    generated = engine.generate(list(range(20, 60)), 4, SamplingParams(temperature=0.0), ignore_eos=True).run()
    assert len(generated.tokens) == 4  # and it runs within them


def test_cache_slots_auto_gives_a_hybrid_s_slots_what_its_k_v_and_state_leave(long_hybrid) -> None:
    f = open_gguf(long_hybrid)
    cfg = model_config(f)
    plan = resolve(LaunchOptions(**CARD, cache_slots="auto", vram_budget_gib=0.015), f)
    assert plan.n_ctx == 4096
    engine = Engine(f, plan.engine_config())
    budget = engine.offload.budget
    assert budget.held["kv cache"] == 4096 * 512 + recurrent_state_bytes(cfg)
    per_slot = slot_bytes_all_layers(engine.offload.store)
    others = sum(n for what, n in budget.held.items() if not what.startswith("expert cache"))
    slots = engine.offload.cache.slots_per_layer
    assert slots == (budget.limit_bytes - others - int(AUTO_HEADROOM * budget.limit_bytes)) // per_slot
    without_state = (budget.limit_bytes - others + recurrent_state_bytes(cfg)
                     - int(AUTO_HEADROOM * budget.limit_bytes)) // per_slot
    assert 2 <= slots <= without_state - 2  # the state's 2.7 MiB: 2.6 slots of 1.0 MiB


def test_decode_graphs_hold_a_batch_of_each_size_and_attention_partials_that_grow_with_the_context() -> None:
    """Each CUDA graph keeps its own activations (decode, and a verify batch of each size up to decode_batch), and
    its split attention spans the whole cache buffer: n_head x (head_dim + 2) floats per row and 128-key split."""
    from runner.backends.limits import DECODE_KV_CHUNK, SMALL_BATCH_ROWS
    from runner.offload.sizing import (attention_partials_bytes_per_position, decode_reservation_bytes,
                                       decode_rows, decode_workspace_bytes)

    assert decode_rows(1) == SMALL_BATCH_ROWS == decode_rows(2)  # eager batches reach 8 rows anyway
    assert decode_rows(3) == 2 * (1 + 2 + 3)
    assert decode_rows(4) == 2 * (1 + 2 + 3 + 4)  # --draft-depth 3: trunk and draft graphs of 1, 2, 3 and 4 rows
    air = SimpleNamespace(n_vocab=151552, n_embd=4096, n_head=96, head_dim=128, n_expert_used=8, n_ff_exp=1408,
                          delta_net=None)  # GLM-4.5-Air's attention and router
    per_position = attention_partials_bytes_per_position(air, 4)
    assert per_position == 20 * 96 * 130 * 4 // DECODE_KV_CHUNK  # 7,800 B: 4% of its f16 K/V per position
    at_128k = decode_reservation_bytes(air, 131072, 4) - decode_workspace_bytes(air, 4)
    assert at_128k == 131072 * per_position and 960 << 20 < at_128k < 1000 << 20  # ~975 MiB a 24 GB card must keep
