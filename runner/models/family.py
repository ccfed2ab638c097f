"""What sets one MoE architecture family apart from another in its GGUF file: the metadata it reads,
the tensors it carries beside the shared transformer's, and its routing defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# How a hybrid file orders its DeltaNet value heads against the key heads they share (H_v = r * H_k):
# "tiled": value head h reads key head h mod H_k (qwen35moe); "grouped": key head h div r (qwen3next).
ValueHeadOrder = Literal["tiled", "grouped"]


@dataclass(frozen=True, slots=True)
class Family:
    arch: str  # general.architecture
    ffn_norm: str  # the norm before each layer's FFN, as the file names it
    router_bias: bool  # exp_probs_b.bias: a correction added to the router's scores for selection only
    shared_experts: bool  # reads expert_shared_count (ffn_*_shexp)
    leading_dense: bool  # reads leading_dense_block_count (dense FFN layers first)
    nextn: bool  # reads nextn_predict_layers (NextN/MTP blocks after the trunk)
    gating_default: int  # expert_gating_func when absent: 1 softmax, 2 sigmoid
    weights_norm_from_file: bool  # False: top-k weights are always renormalised, as llama.cpp does
    rms_eps_synth: float  # the norm epsilon `runner synth` writes (the published models')
    # expert_feed_forward_length must be in the file (glm4moe); else its absence (or 0) means
    # feed_forward_length / expert_used_count, as llama.cpp's loaders fall back.
    expert_width_required: bool = True
    # Hybrid linear-attention families (Gated DeltaNet layers beside gated full attention); None: none.
    value_heads: ValueHeadOrder | None = None
    fused_beta_alpha: bool = False  # DeltaNet beta/alpha projections as one ssm_ba (else ssm_beta, ssm_alpha)
    rope_sections: bool = False  # reads rope.dimension_sections (multi-section rotary, llama.cpp's IMROPE)
    # Routed gate and up experts may come fused as one ffn_gate_up_exps [E, 2 F, D] (llama.cpp's
    # create_tensor_gate_up_exps: the hybrid loaders call it; glm4moe's and qwen3moe's do not).
    fused_gate_up: bool = False

    @property
    def hybrid(self) -> bool:
        """Gated DeltaNet + gated attention layers, a shared expert behind a sigmoid gate."""
        return self.value_heads is not None
