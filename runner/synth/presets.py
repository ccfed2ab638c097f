"""Shapes of the synthetic models: tiny test fixtures and the published shapes used for benchmarks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from runner.errors import SynthError


@dataclass(frozen=True)
class SynthShape:
    n_vocab: int
    n_embd: int
    n_layer: int  # trunk layers
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    n_ff: int  # leading dense layers' FFN width (also written as feed_forward_length)
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_expert_shared: int = 0
    n_dense_lead: int = 0
    n_nextn: int = 0
    qkv_bias: bool = False
    qk_norm: bool = False
    n_ctx: int = 4096
    rope_base: float = 10000.0
    expert_weights_scale: float = 1.0
    full_size: bool = False  # written as random quant blocks directly, never through float weights
    # Hybrid families (qwen35moe, qwen3next): Gated DeltaNet layers, all but each interval-th trunk layer.
    ssm_state: int = 0  # key/value head width of the DeltaNet layers (ssm.state_size)
    ssm_k_heads: int = 0  # ssm.group_count
    ssm_v_heads: int = 0  # ssm.time_step_rank
    ssm_conv_kernel: int = 4
    full_attention_interval: int = 4
    n_ff_shexp: int = 0  # the gated shared expert's width
    rope_sections: tuple[int, int, int, int] | None = None  # qwen35moe's multi-section rotary
    ssm_in: bool = False  # qwen3next: the older fused q/k/v/z projection (ssm_in) instead of attn_qkv + attn_gate
    # Layouts llama.cpp's loaders accept beside the usual one (the tiny-fused presets write all three):
    fused_qkv: bool = False  # attention layers' q, k, v (and biases) as one attn_qkv (every family)
    fused_gate_up: bool = False  # routed gate and up experts as one ffn_gate_up_exps [E, 2 F, D] (hybrids)
    ff_exp_per_layer: bool = False  # expert_feed_forward_length written as an array, one entry per block

    def __post_init__(self) -> None:
        if self.n_layer < 1 or self.n_dense_lead >= self.n_layer:
            raise SynthError(f"need at least one MoE layer: {self.n_layer} layers, {self.n_dense_lead} dense")
        if not 1 <= self.n_expert_used <= self.n_expert:
            raise SynthError(f"experts used per token ({self.n_expert_used}) must be in 1..{self.n_expert}")
        if self.ssm_state and self.ssm_v_heads % self.ssm_k_heads:
            raise SynthError(f"value heads ({self.ssm_v_heads}) must be a multiple of key heads ({self.ssm_k_heads})")

    def is_recurrent(self, layer: int) -> bool:
        """A Gated DeltaNet layer (the trunk's, by llama.cpp's full_attention_interval rule)."""
        return bool(self.ssm_state) and layer < self.n_layer and (layer + 1) % self.full_attention_interval != 0


# Tiny hybrids: 3 DeltaNet layers and 1 gated attention layer, 2 key heads shared by 4 value heads (so
# the value-head order matters), an MTP block. qwen35moe's tiny sections (2, 2, 0, 0) leave rotary pairs 2
# and 6 at position 0 (the sections llama.cpp gives text position 0), which the published (11, 11, 10, 0)
# never does: pair 2 turns fast enough that parity with llama.cpp checks the rule.
_HYBRID_TINY = SynthShape(n_vocab=512, n_embd=256, n_layer=4, n_head=4, n_head_kv=2, head_dim=64, n_rot=16,
                          n_ff=256, n_expert=8, n_expert_used=2, n_ff_exp=256, n_expert_shared=1, n_nextn=1,
                          qk_norm=True, expert_weights_scale=0.0, ssm_state=64, ssm_k_heads=2, ssm_v_heads=4,
                          n_ff_shexp=256)

_GLM_TINY = SynthShape(n_vocab=512, n_embd=256, n_layer=3, n_head=4, n_head_kv=2, head_dim=64, n_rot=32, n_ff=512,
                       n_expert=8, n_expert_used=2, n_ff_exp=256, n_expert_shared=1, n_dense_lead=1, n_nextn=1,
                       qkv_bias=True, expert_weights_scale=2.5)
_QWEN3_TINY = SynthShape(n_vocab=512, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_rot=64, n_ff=512,
                         n_expert=8, n_expert_used=2, n_ff_exp=256, qk_norm=True, expert_weights_scale=0.0)
# "tiny-fused": tiny with the fused layouts the family's llama.cpp loader accepts (glm4moe and qwen3moe read
# no fused ffn_gate_up_exps) and expert_feed_forward_length as a per-block array.
_FUSED = {"fused_qkv": True, "ff_exp_per_layer": True}
_FUSED_HYBRID = {**_FUSED, "fused_gate_up": True}

PRESETS: dict[str, dict[str, SynthShape]] = {
    "glm4moe": {
        "tiny": _GLM_TINY,
        "tiny-fused": dataclasses.replace(_GLM_TINY, **_FUSED),
        "small": SynthShape(n_vocab=2048, n_embd=512, n_layer=4, n_head=8, n_head_kv=2, head_dim=64, n_rot=32,
                            n_ff=1024, n_expert=16, n_expert_used=4, n_ff_exp=256, n_expert_shared=1,
                            n_dense_lead=1, n_nextn=1, qkv_bias=True, expert_weights_scale=2.5),
        # GLM-4.5-Air: 46 layers + 1 NextN, hidden 4096, 96/8 heads of 128, 128 experts of 1408, top-8.
        "glm45-air": SynthShape(n_vocab=151552, n_embd=4096, n_layer=46, n_head=96, n_head_kv=8, head_dim=128,
                                n_rot=64, n_ff=10944, n_expert=128, n_expert_used=8, n_ff_exp=1408,
                                n_expert_shared=1, n_dense_lead=1, n_nextn=1, qkv_bias=True, n_ctx=131072,
                                rope_base=1e6, full_size=True),
        # 48 layers (1 dense), hidden 2048, 512 experts of 512, top-10, one shared expert, one NextN
        # block: the shape the 150-slot home-24g profile was qualified on.
        "seed": SynthShape(n_vocab=151552, n_embd=2048, n_layer=48, n_head=16, n_head_kv=4, head_dim=128,
                           n_rot=64, n_ff=5632, n_expert=512, n_expert_used=10, n_ff_exp=512, n_expert_shared=1,
                           n_dense_lead=1, n_nextn=1, qkv_bias=True, n_ctx=131072, rope_base=1e6,
                           full_size=True),
    },
    "qwen3moe": {
        "tiny": _QWEN3_TINY,
        "tiny-fused": dataclasses.replace(_QWEN3_TINY, **_FUSED),
        "small": SynthShape(n_vocab=2048, n_embd=512, n_layer=4, n_head=8, n_head_kv=2, head_dim=64, n_rot=64,
                            n_ff=1024, n_expert=16, n_expert_used=4, n_ff_exp=256, qk_norm=True,
                            expert_weights_scale=0.0),
        # Qwen3-30B-A3B: 48 layers, hidden 2048, 32/4 heads of 128, 128 experts of 768, top-8.
        "qwen3-30b-a3b": SynthShape(n_vocab=151936, n_embd=2048, n_layer=48, n_head=32, n_head_kv=4,
                                    head_dim=128, n_rot=128, n_ff=6144, n_expert=128, n_expert_used=8,
                                    n_ff_exp=768, qk_norm=True, n_ctx=40960, rope_base=1e6,
                                    expert_weights_scale=0.0, full_size=True),
    },
    "qwen35moe": {
        "tiny": dataclasses.replace(_HYBRID_TINY, rope_sections=(2, 2, 0, 0)),
        "tiny-fused": dataclasses.replace(_HYBRID_TINY, rope_sections=(2, 2, 0, 0), **_FUSED_HYBRID),
        # Qwen3.5-35B-A3B-like: 40 layers, hidden 2048, 16/2 heads of 256 (rotary 64), DeltaNet 16 key
        # and 32 value heads of 128, 256 experts of 512, top-8, a shared expert of 512, an MTP block.
        "qwen35-35b-a3b": SynthShape(n_vocab=248320, n_embd=2048, n_layer=40, n_head=16, n_head_kv=2, head_dim=256,
                                     n_rot=64, n_ff=512, n_expert=256, n_expert_used=8, n_ff_exp=512,
                                     n_expert_shared=1, n_nextn=1, qk_norm=True, n_ctx=262144, rope_base=1e7,
                                     expert_weights_scale=0.0, full_size=True, ssm_state=128, ssm_k_heads=16,
                                     ssm_v_heads=32, n_ff_shexp=512, rope_sections=(11, 11, 10, 0)),
        # Qwen3.5-397B-A17B-like: 60 layers, hidden 4096, 32/2 heads of 256, DeltaNet 16/64 heads of 128,
        # 512 experts of 1024, top-10, a shared expert of 1024: the expert count the home-24g profile is
        # qualified on (use --layers to cut it to what the disk holds).
        "qwen35-397b-a17b": SynthShape(n_vocab=248320, n_embd=4096, n_layer=60, n_head=32, n_head_kv=2,
                                       head_dim=256, n_rot=64, n_ff=1024, n_expert=512, n_expert_used=10,
                                       n_ff_exp=1024, n_expert_shared=1, n_nextn=1, qk_norm=True, n_ctx=262144,
                                       rope_base=1e7, expert_weights_scale=0.0, full_size=True, ssm_state=128,
                                       ssm_k_heads=16, ssm_v_heads=64, n_ff_shexp=1024,
                                       rope_sections=(11, 11, 10, 0)),
    },
    "qwen3next": {
        "tiny": _HYBRID_TINY,
        # As tiny, with the q/k/v/z projection fused as ssm_in (Qwen3-Next files converted before attn_qkv).
        "tiny-ssm-in": dataclasses.replace(_HYBRID_TINY, ssm_in=True),
        "tiny-fused": dataclasses.replace(_HYBRID_TINY, **_FUSED_HYBRID),
        # Qwen3-Next-80B-A3B-like: 48 layers, hidden 2048, 16/2 heads of 256 (rotary 64), DeltaNet 16/32
        # heads of 128, 512 experts of 512, top-10, a shared expert of 512, an MTP block.
        "qwen3next-80b-a3b": SynthShape(n_vocab=151936, n_embd=2048, n_layer=48, n_head=16, n_head_kv=2,
                                        head_dim=256, n_rot=64, n_ff=512, n_expert=512, n_expert_used=10,
                                        n_ff_exp=512, n_expert_shared=1, n_nextn=1, qk_norm=True, n_ctx=262144,
                                        rope_base=1e7, expert_weights_scale=0.0, full_size=True, ssm_state=128,
                                        ssm_k_heads=16, ssm_v_heads=32, n_ff_shexp=512),
    },
}


def resolve_shape(arch: str, preset: str, layers: int | None = None, experts: int | None = None) -> SynthShape:
    """The preset's shape with --layers / --experts applied."""
    if arch not in PRESETS:
        raise SynthError(f"unknown architecture '{arch}'; choose from {', '.join(PRESETS)}")
    if preset not in PRESETS[arch]:
        raise SynthError(f"unknown preset '{preset}' for {arch}; choose from {', '.join(PRESETS[arch])}")
    shape = PRESETS[arch][preset]
    changes: dict[str, int] = {}
    if layers is not None:
        changes["n_layer"] = layers
        changes["n_dense_lead"] = min(shape.n_dense_lead, max(layers - 1, 0))
    if experts is not None:
        changes["n_expert"] = experts
        changes["n_expert_used"] = min(shape.n_expert_used, experts)
    return dataclasses.replace(shape, **changes) if changes else shape
