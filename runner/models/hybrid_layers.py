"""The layers of the hybrid linear-attention families (qwen35moe, qwen3next), after llama.cpp's graphs.

A layer is x + mixer(attn_norm(x)), then + moe(post_attention_norm(.)), where the mixer is either
gated full attention or a Gated DeltaNet, and the MoE adds a shared expert behind a sigmoid gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from runner.backends.step import Step
from runner.models.config import ModelConfig
from runner.models.delta_net_weights import DeltaNetWeights
from runner.models.transformer import dense_ffn
from runner.models.weights import AttentionWeights, LayerWeights, MoEWeights

if TYPE_CHECKING:
    from runner.backends.hybrid_ops import HybridOps


def gated_attention_block(ops: HybridOps, cfg: ModelConfig, a: AttentionWeights, h: Any, positions: np.ndarray,
                          kv: Any, slot: int, step: Step) -> Any:
    """GQA attention whose q projection also gives a per-head output gate: out = wo(attn * sigmoid(gate)).

    q and k are RMS-normed per head, then rotated: multi-section (qwen35moe) or NEOX on the first n_rot dims.
    """
    n_tok, hd = h.shape[0], cfg.head_dim
    q_gate = ops.linear(h, a.wq, a.bq).reshape(n_tok, cfg.n_head, 2 * hd)  # per head: query, then its gate
    q = ops.rms_norm(q_gate[:, :, :hd], a.q_norm, cfg.rms_eps)
    gate = q_gate[:, :, hd:].reshape(n_tok, cfg.n_head * hd)
    k = ops.rms_norm(ops.linear(h, a.wk, a.bk).reshape(n_tok, cfg.n_head_kv, hd), a.k_norm, cfg.rms_eps)
    v = ops.linear(h, a.wv, a.bv).reshape(n_tok, cfg.n_head_kv, hd)
    if cfg.rope_sections is not None:
        q = ops.rope_multi(q, positions, cfg.n_rot, cfg.rope_base, cfg.rope_sections, step)
        k = ops.rope_multi(k, positions, cfg.n_rot, cfg.rope_base, cfg.rope_sections, step)
        k_all, v_all = kv.store(slot, positions, k, v, step)
    else:
        q, k_all, v_all = kv.store_roped(slot, positions, q, k, v, cfg.n_rot, cfg.rope_base, step)
    return ops.linear(ops.attention(q, k_all, v_all, positions, step) * ops.sigmoid(gate), a.wo)


def _qkv_and_gate(ops: HybridOps, cfg: ModelConfig, w: DeltaNetWeights, h: Any) -> tuple[Any, Any]:
    """The conv input [T, conv_dim] (q, k, v, each head-major) and the output gate z [T, value_dim]."""
    if w.qkvz is None:
        return ops.linear(h, w.qkv), ops.linear(h, w.gate)
    # ssm_in (older qwen3next files): per key head [q, k, its r value heads, their r gates]
    dn, n_tok = cfg.delta_net, h.shape[0]
    s, rv = dn.head_dim, dn.value_dim // dn.n_k_heads
    y = ops.linear(h, w.qkvz).reshape(n_tok, dn.n_k_heads, 2 * s + 2 * rv)
    q, k = y[:, :, :s].reshape(n_tok, -1), y[:, :, s : 2 * s].reshape(n_tok, -1)
    v, z = y[:, :, 2 * s : 2 * s + rv].reshape(n_tok, -1), y[:, :, 2 * s + rv :].reshape(n_tok, -1)
    return ops.concat(ops.concat(q, k), v), z


def _beta_alpha(ops: HybridOps, cfg: ModelConfig, w: DeltaNetWeights, h: Any) -> tuple[Any, Any]:
    """beta and alpha logits [T, H_v], value heads in the file's order."""
    if w.beta_alpha is None:
        return ops.linear(h, w.beta), ops.linear(h, w.alpha)
    dn, n_tok = cfg.delta_net, h.shape[0]
    r = dn.n_v_heads // dn.n_k_heads
    ba = ops.linear(h, w.beta_alpha).reshape(n_tok, dn.n_k_heads, 2 * r)  # per key head: r betas, r alphas
    return ba[:, :, :r].reshape(n_tok, -1), ba[:, :, r:].reshape(n_tok, -1)


def delta_net_block(ops: HybridOps, cfg: ModelConfig, w: DeltaNetWeights, h: Any, positions: np.ndarray, cache: Any,
                    layer: int) -> Any:
    """Gated DeltaNet: short conv (with the layer's conv state) over q, k, v, L2-normed q and k, the gated
    delta rule (with its recurrent state), then RMSNorm(o) * SiLU(z) per value head and the out projection."""
    dn, n_tok = cfg.delta_net, h.shape[0]
    assert dn is not None
    qkv, z = _qkv_and_gate(ops, cfg, w, h)
    beta, alpha = _beta_alpha(ops, cfg, w, h)
    g, beta = ops.delta_net_gates(alpha, beta, w.dt_bias, w.a)
    state = cache.recurrent(layer)
    conv, window = ops.ssm_conv(qkv, state.conv, w.conv1d)
    kd, s = dn.key_dim, dn.head_dim
    q = ops.l2_norm(conv[:, :kd].reshape(n_tok, dn.n_k_heads, s), cfg.rms_eps)
    k = ops.l2_norm(conv[:, kd : 2 * kd].reshape(n_tok, dn.n_k_heads, s), cfg.rms_eps)
    v = conv[:, 2 * kd :].reshape(n_tok, dn.n_v_heads, s)
    o, states = ops.gated_delta_net(q, k, v, g, beta, state.ssm, dn.value_heads == "grouped",
                                    cache.keeps_rows(positions))
    cache.update(layer, positions, window, states)
    o = ops.swiglu(z.reshape(n_tok, dn.n_v_heads, s), ops.rms_norm(o, w.norm, cfg.rms_eps))
    return ops.linear(o.reshape(n_tok, dn.value_dim), w.out)


def gated_moe_ffn(ops: HybridOps, cfg: ModelConfig, w: MoEWeights, x: Any, step: Step,
                  pick: Callable[[Any], Any] | None = None) -> Any:
    """Routed experts plus the shared expert scaled by sigmoid(x . shared_gate), one scalar per token; `pick`
    as in moe_ffn."""
    ids, weights = ops.route(ops.linear(x, w.router), w.probs_bias, cfg)
    if pick is not None:
        ids = pick(ids)
    out = ops.moe(x, ids, weights, w, step)
    assert w.shared is not None and w.shared_gate is not None
    gate = ops.sigmoid(ops.linear(x, w.shared_gate).reshape(-1, 1))  # a 1-D weight: one dot per token
    return out + dense_ffn(ops, w.shared, x) * gate


def mixer_block(ops: HybridOps, cfg: ModelConfig, lw: LayerWeights, x: Any, positions: np.ndarray, cache: Any,
                layer: int, step: Step) -> Any:
    """The pre-normed token-mixing half of a layer (DeltaNet or gated attention), without the residual;
    `cache` gives attention layers `store(layer, ...)` and DeltaNet layers their state."""
    h = ops.rms_norm(x, lw.attn_norm, cfg.rms_eps)
    if isinstance(lw.attn, DeltaNetWeights):
        return delta_net_block(ops, cfg, lw.attn, h, positions, cache, layer)
    return gated_attention_block(ops, cfg, lw.attn, h, positions, cache, layer, step)


def hybrid_ffn_block(ops: HybridOps, cfg: ModelConfig, lw: LayerWeights, x: Any, step: Step,
                     pick: Callable[[Any], Any] | None = None) -> Any:
    """The pre-normed feed-forward half (routed experts and the gated shared expert), without the residual."""
    assert isinstance(lw.ffn, MoEWeights)
    return gated_moe_ffn(ops, cfg, lw.ffn, ops.rms_norm(x, lw.ffn_norm, cfg.rms_eps), step, pick)


def hybrid_layer(ops: HybridOps, cfg: ModelConfig, lw: LayerWeights, x: Any, positions: np.ndarray, cache: Any,
                 layer: int, step: Step) -> Any:
    x = x + mixer_block(ops, cfg, lw, x, positions, cache, layer, step)
    return x + hybrid_ffn_block(ops, cfg, lw, x, step)
