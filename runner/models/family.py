"""What sets one MoE architecture family apart from another in its GGUF file: the metadata it reads,
the tensors it carries beside the shared transformer's, and its routing defaults."""

from __future__ import annotations

from dataclasses import dataclass


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
