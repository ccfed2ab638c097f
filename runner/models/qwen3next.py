"""Qwen3-Next (`qwen3next`: 80B-A3B): the hybrid layout of qwen35moe (Gated DeltaNet with gated full
attention every fourth layer, routed experts plus a sigmoid-gated shared expert, an MTP block), with
plain NEOX partial rotary.

Its files keep the checkpoint's grouped value-head order (value head h reads key head h div (H_v/H_k))
and one fused beta/alpha projection (ssm_ba, per key head [beta..., alpha...]); older conversions carry
the q/k/v/z projection fused as ssm_in. The forward pass is hybrid.py's."""

from dataclasses import replace

from runner.models.qwen35moe import QWEN35MOE

# qwen35moe's layout; what differs is the value-head order, the fused beta/alpha and plain rotary.
QWEN3NEXT = replace(QWEN35MOE, arch="qwen3next", value_heads="grouped", fused_beta_alpha=True, rope_sections=False)
