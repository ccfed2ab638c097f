"""Qwen3-30B-A3B / 235B-A22B (`qwen3moe`): softmax routing over every layer's experts, top-k weights
always renormalised, q/k norms; no shared experts and no MTP block. The forward pass is transformer.py's."""

from runner.models.family import Family

QWEN3MOE = Family(
    arch="qwen3moe",
    ffn_norm="ffn_norm.weight",
    router_bias=False,
    shared_experts=False,
    leading_dense=False,
    nextn=False,
    gating_default=1,
    weights_norm_from_file=False,
    rms_eps_synth=1e-6,
    expert_width_required=False,
)
