"""A Gated DeltaNet layer's tensors, by the names llama.cpp's qwen35moe / qwen3next loaders read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from runner.gguf_file import TensorInfo
from runner.models.config import ModelConfig

if TYPE_CHECKING:
    from runner.models.weights import _Finder


@dataclass(frozen=True)
class DeltaNetWeights:
    qkv: TensorInfo | None  # attn_qkv [conv_dim, n_embd]: q, k, v (each head-major) into the short conv
    gate: TensorInfo | None  # attn_gate [value_dim, n_embd]: z, the output norm's SiLU gate
    qkvz: TensorInfo | None  # ssm_in [2 key_dim + 2 value_dim, n_embd], older qwen3next files: per key head q, k, v, z
    conv1d: TensorInfo  # ssm_conv1d [conv_dim, conv_kernel]
    dt_bias: TensorInfo  # ssm_dt.bias [H_v]
    a: TensorInfo  # ssm_a [H_v]: -exp(A_log)
    beta: TensorInfo | None  # ssm_beta [H_v, n_embd] (qwen35moe)
    alpha: TensorInfo | None  # ssm_alpha [H_v, n_embd] (qwen35moe)
    beta_alpha: TensorInfo | None  # ssm_ba [2 H_v, n_embd] (qwen3next): per key head r betas then r alphas
    norm: TensorInfo  # ssm_norm [head_dim]: the gated RMSNorm's weight
    out: TensorInfo  # ssm_out [n_embd, value_dim]


def delta_net_weights(t: _Finder, cfg: ModelConfig, p: str) -> DeltaNetWeights:
    """The DeltaNet tensors of the layer whose names start with `p` ("blk.3.")."""
    dn = cfg.delta_net
    assert dn is not None
    d, h_v = cfg.n_embd, dn.n_v_heads
    qkv = gate = qkvz = None
    if t.f.has_tensor(p + "ssm_in.weight") and not cfg.family.rope_sections:  # qwen3next's legacy fused layout
        qkvz = t.get(p + "ssm_in.weight", (dn.conv_dim + dn.value_dim, d))
    else:
        qkv = t.get(p + "attn_qkv.weight", (dn.conv_dim, d))
        gate = t.get(p + "attn_gate.weight", (dn.value_dim, d))
    fused = cfg.family.fused_beta_alpha
    return DeltaNetWeights(
        qkv=qkv,
        gate=gate,
        qkvz=qkvz,
        conv1d=t.get(p + "ssm_conv1d.weight", (dn.conv_dim, dn.conv_kernel)),
        dt_bias=t.get(p + "ssm_dt.bias", (h_v,)),
        a=t.get(p + "ssm_a", (h_v,)),
        beta=None if fused else t.get(p + "ssm_beta.weight", (h_v, d)),
        alpha=None if fused else t.get(p + "ssm_alpha.weight", (h_v, d)),
        beta_alpha=t.get(p + "ssm_ba.weight", (2 * h_v, d)) if fused else None,
        norm=t.get(p + "ssm_norm.weight", (dn.head_dim,)),
        out=t.get(p + "ssm_out.weight", (d, dn.value_dim)),
    )
