"""The tensors and metadata of a synthetic hybrid model (qwen35moe, qwen3next), as llama.cpp loads them."""

from __future__ import annotations

from collections.abc import Callable

import gguf

from runner.models.family import Family
from runner.synth.presets import SynthShape

# (name, shape, kind): PlannedTensor's fields, built by writer.tensor_plan
Planned = tuple[str, tuple[int, ...], str]


def hybrid_layer_plan(family: Family, s: SynthShape, i: int) -> list[Planned]:
    """Layer i's tensors: DeltaNet or gated attention, then the MoE with its gated shared expert."""
    d, q_dim = s.n_embd, s.n_head * s.head_dim
    key_dim, value_dim = s.ssm_k_heads * s.ssm_state, s.ssm_v_heads * s.ssm_state
    conv_dim = 2 * key_dim + value_dim
    out: list[Planned] = []
    add: Callable[..., None] = lambda name, shape, kind="matrix": out.append((f"blk.{i}.{name}", shape, kind))
    add("attn_norm.weight", (d,), "norm")
    if s.is_recurrent(i):
        if s.ssm_in:
            add("ssm_in.weight", (conv_dim + value_dim, d))
        else:
            add("attn_qkv.weight", (conv_dim, d))
            add("attn_gate.weight", (value_dim, d))
        add("ssm_conv1d.weight", (conv_dim, s.ssm_conv_kernel), "conv")
        add("ssm_dt.bias", (s.ssm_v_heads,), "bias")
        add("ssm_a", (s.ssm_v_heads,), "decay")
        if family.fused_beta_alpha:
            add("ssm_ba.weight", (2 * s.ssm_v_heads, d))
        else:
            add("ssm_beta.weight", (s.ssm_v_heads, d))
            add("ssm_alpha.weight", (s.ssm_v_heads, d))
        add("ssm_norm.weight", (s.ssm_state,), "norm")
        add("ssm_out.weight", (d, value_dim))
    else:
        out += attention_qkv_plan(s, i, 2 * q_dim)  # per head: the query, then its output gate
        add("attn_q_norm.weight", (s.head_dim,), "norm")
        add("attn_k_norm.weight", (s.head_dim,), "norm")
        add("attn_output.weight", (d, q_dim))
    add(family.ffn_norm, (d,), "norm")
    e, fe, fs = s.n_expert, s.n_ff_exp, s.n_ff_shexp
    add("ffn_gate_inp.weight", (e, d), "router")
    out += gate_up_plan(s, i)
    add("ffn_down_exps.weight", (e, d, fe))
    add("ffn_gate_inp_shexp.weight", (d,), "router")
    add("ffn_gate_shexp.weight", (fs, d))
    add("ffn_up_shexp.weight", (fs, d))
    add("ffn_down_shexp.weight", (d, fs))
    return out


def attention_qkv_plan(s: SynthShape, i: int, q_rows: int) -> list[Planned]:
    """An attention layer's q, k, v projections (and biases when the shape has them), apart or fused."""
    d, kv_dim = s.n_embd, s.n_head_kv * s.head_dim
    rows = {"q": q_rows, "k": kv_dim, "v": kv_dim}
    if s.fused_qkv:
        fused = [(f"blk.{i}.attn_qkv.weight", (sum(rows.values()), d), "matrix")]
        return fused + ([(f"blk.{i}.attn_qkv.bias", (sum(rows.values()),), "bias")] if s.qkv_bias else [])
    out: list[Planned] = [(f"blk.{i}.attn_{x}.weight", (n, d), "matrix") for x, n in rows.items()]
    return out + ([(f"blk.{i}.attn_{x}.bias", (n,), "bias") for x, n in rows.items()] if s.qkv_bias else [])


def gate_up_plan(s: SynthShape, i: int) -> list[Planned]:
    """The routed experts' gate and up matrices, apart or fused (per expert: its gate rows, then its up rows)."""
    e, fe, d = s.n_expert, s.n_ff_exp, s.n_embd
    if s.fused_gate_up:
        return [(f"blk.{i}.ffn_gate_up_exps.weight", (e, 2 * fe, d), "matrix")]
    return [(f"blk.{i}.ffn_gate_exps.weight", (e, fe, d), "matrix"), (f"blk.{i}.ffn_up_exps.weight", (e, fe, d), "matrix")]


def write_hybrid_metadata(w: gguf.GGUFWriter, family: Family, s: SynthShape) -> None:
    """The keys llama.cpp's hybrid loaders read beyond the shared ones (writer.write_metadata)."""
    w.add_expert_shared_feed_forward_length(s.n_ff_shexp)
    w.add_ssm_conv_kernel(s.ssm_conv_kernel)
    w.add_ssm_state_size(s.ssm_state)
    w.add_ssm_group_count(s.ssm_k_heads)
    w.add_ssm_time_step_rank(s.ssm_v_heads)
    w.add_ssm_inner_size(s.ssm_state * s.ssm_v_heads)
    w.add_full_attention_interval(s.full_attention_interval)
    if family.rope_sections:
        if s.rope_sections is None:
            raise ValueError(f"{family.arch} needs rope sections in its synth shape")
        w.add_rope_dimension_sections(list(s.rope_sections))
