"""Qwen3.5 / 3.6 MoE (`qwen35moe`: 35B-A3B, 122B-A10B, 397B-A17B): three of every four layers are Gated
DeltaNet, the fourth gated full attention with multi-section rotary; every layer's FFN is softmax-routed
experts plus a shared expert behind a sigmoid gate; an MTP block follows the trunk.

Its converter reorders the DeltaNet value heads to tiled order (value head h reads key head h mod H_k)
and stores the beta and alpha projections apart. The forward pass is hybrid.py's."""

from runner.models.family import Family

QWEN35MOE = Family(
    arch="qwen35moe",
    ffn_norm="post_attention_norm.weight",
    router_bias=False,
    shared_experts=True,
    leading_dense=False,
    nextn=True,
    gating_default=1,
    weights_norm_from_file=False,
    rms_eps_synth=1e-6,
    expert_width_required=False,
    value_heads="tiled",
    fused_beta_alpha=False,
    fused_gate_up=True,
    rope_sections=True,
)
