"""Qwen3-Next (`qwen3next`: 80B-A3B): the hybrid layout of qwen35moe (Gated DeltaNet with gated full
attention every fourth layer, routed experts plus a sigmoid-gated shared expert, an MTP block), with
plain NEOX partial rotary.

Its files keep the checkpoint's grouped value-head order (value head h reads key head h div (H_v/H_k))
and one fused beta/alpha projection (ssm_ba, per key head [beta..., alpha...]); older conversions carry
the q/k/v/z projection fused as ssm_in. The forward pass is hybrid.py's."""

from runner.models.family import Family

QWEN3NEXT = Family(
    arch="qwen3next",
    ffn_norm="post_attention_norm.weight",
    router_bias=False,
    shared_experts=True,
    leading_dense=False,
    nextn=True,
    gating_default=1,
    weights_norm_from_file=False,
    rms_eps_synth=1e-6,
    expert_width_required=False,
    value_heads="grouped",
    fused_beta_alpha=True,
    fused_gate_up=True,
    rope_sections=False,
)
