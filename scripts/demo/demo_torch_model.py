"""The demo model in PyTorch: the glm4moe forward pass of runner/models/, term for term, plus its NextN block.

Only scripts/demo/train_demo.py needs this (PyTorch is never a requirement of the runner). Parameters are
named and shaped as the GGUF tensors (numpy order: rows, row_length), so export is a plain copy.
The routed experts are computed densely and masked by the router's combine weights: the same sum as
picking k experts per token (unpicked experts get weight 0, so no gradient either), run as large
matrix products, which is faster than gathering tokens per expert at this size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DemoShape:
    """Mirrors runner.synth.presets.SynthShape's fields for glm4moe (export builds one from asdict).

    7.15M parameters, 7.4 MiB at Q8_0. Sixteen narrow experts rather than eight wide ones (the same
    bytes): more experts make the slot-count sweep below the expert count say more.
    """

    n_vocab: int = 2048
    n_embd: int = 256
    n_layer: int = 5  # trunk layers: one dense, then MoE; the NextN block follows as block 5
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_rot: int = 32
    n_ff: int = 768
    n_expert: int = 16
    n_expert_used: int = 2
    n_ff_exp: int = 64
    n_expert_shared: int = 1
    n_dense_lead: int = 1
    n_nextn: int = 1
    qkv_bias: bool = True
    n_ctx: int = 1024
    rope_base: float = 10000.0
    expert_weights_scale: float = 2.5
    rms_eps: float = 1e-5

    def as_dict(self) -> dict:
        return asdict(self)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_neox(x: torch.Tensor, n_rot: int, base: float) -> torch.Tensor:
    """x [B, T, H, D]: rotate the first n_rot dims of each head, dim i with i + n_rot/2 (positions 0..T-1)."""
    half = n_rot // 2
    inv_freq = base ** (-torch.arange(half, device=x.device, dtype=torch.float64) * 2.0 / n_rot)
    theta = torch.arange(x.shape[1], device=x.device, dtype=torch.float64)[:, None] * inv_freq[None]
    cos, sin = theta.cos().float()[:, None], theta.sin().float()[:, None]  # [T, 1, half]
    x0, x1, rest = x[..., :half].float(), x[..., half:n_rot].float(), x[..., n_rot:]
    return torch.cat([(x0 * cos - x1 * sin).to(x.dtype), (x0 * sin + x1 * cos).to(x.dtype), rest], dim=-1)


def _param(*shape: int, std: float | None = None, ones: bool = False) -> nn.Parameter:
    if ones:
        return nn.Parameter(torch.ones(*shape))
    if std is None:
        return nn.Parameter(torch.zeros(*shape))
    return nn.Parameter(torch.randn(*shape) * std)


class Block(nn.Module):
    """One decoder layer: pre-normed GQA attention with qkv bias, then a dense FFN or the routed MoE."""

    def __init__(self, s: DemoShape, moe: bool, out_std: float):
        super().__init__()
        d, q_dim, kv_dim = s.n_embd, s.n_head * s.head_dim, s.n_head_kv * s.head_dim
        self.s, self.moe = s, moe
        std = 0.02
        self.attn_norm = _param(d, ones=True)
        self.attn_q, self.attn_q_b = _param(q_dim, d, std=std), _param(q_dim)
        self.attn_k, self.attn_k_b = _param(kv_dim, d, std=std), _param(kv_dim)
        self.attn_v, self.attn_v_b = _param(kv_dim, d, std=std), _param(kv_dim)
        self.attn_output = _param(d, q_dim, std=out_std)
        self.post_attention_norm = _param(d, ones=True)
        if not moe:
            self.ffn_gate, self.ffn_up = _param(s.n_ff, d, std=std), _param(s.n_ff, d, std=std)
            self.ffn_down = _param(d, s.n_ff, std=out_std)
            return
        e, fe, fs = s.n_expert, s.n_ff_exp, s.n_ff_exp * s.n_expert_shared
        self.ffn_gate_inp = _param(e, d, std=std)
        self.register_buffer("exp_probs_b", torch.zeros(e))  # selection-only bias, moved by balancing
        self.ffn_gate_exps, self.ffn_up_exps = _param(e, fe, d, std=std), _param(e, fe, d, std=std)
        self.ffn_down_exps = _param(e, d, fe, std=out_std)
        self.ffn_gate_shexp, self.ffn_up_shexp = _param(fs, d, std=std), _param(fs, d, std=std)
        self.ffn_down_shexp = _param(d, fs, std=out_std)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        s = self.s
        b, t, _ = x.shape
        h = rms_norm(x, self.attn_norm, s.rms_eps)  # float32; autocast casts at each product
        q = F.linear(h, self.attn_q, self.attn_q_b).view(b, t, s.n_head, s.head_dim)
        k = F.linear(h, self.attn_k, self.attn_k_b).view(b, t, s.n_head_kv, s.head_dim)
        v = F.linear(h, self.attn_v, self.attn_v_b).view(b, t, s.n_head_kv, s.head_dim)
        q, k = rope_neox(q, s.n_rot, s.rope_base), rope_neox(k, s.n_rot, s.rope_base)
        group = s.n_head // s.n_head_kv  # query head h reads kv head h // group, as np.repeat does
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return F.linear(o.transpose(1, 2).reshape(b, t, -1), self.attn_output)

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [N, d] -> ids [N, k], weights [N, k]: sigmoid scores, top-k of score + bias, renormalised, scaled."""
        s = self.s
        with torch.autocast(h.device.type, enabled=False):
            probs = torch.sigmoid(F.linear(h.float(), self.ffn_gate_inp.float()))
        ids = torch.topk(probs.detach() + self.exp_probs_b, s.n_expert_used, dim=-1).indices
        weights = probs.gather(1, ids)
        weights = weights / weights.sum(-1, keepdim=True).clamp_min(6.103515625e-5) * s.expert_weights_scale
        return ids, weights

    def moe_ffn(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.s
        shape = h.shape
        h = h.reshape(-1, s.n_embd)
        ids, weights = self.route(h)
        combine = torch.zeros(h.shape[0], s.n_expert, device=h.device, dtype=weights.dtype).scatter(1, ids, weights)
        e, fe, d = s.n_expert, s.n_ff_exp, s.n_embd
        gate = F.linear(h, self.ffn_gate_exps.reshape(e * fe, d))  # [N, E*F]: every expert at once
        up = F.linear(h, self.ffn_up_exps.reshape(e * fe, d))
        act = (F.silu(gate) * up).view(-1, e, fe) * combine[:, :, None]
        routed = act.view(-1, e * fe) @ self.ffn_down_exps.permute(0, 2, 1).reshape(e * fe, d)
        shared = F.linear(F.silu(F.linear(h, self.ffn_gate_shexp)) * F.linear(h, self.ffn_up_shexp), self.ffn_down_shexp)
        return (routed + shared).view(shape), ids

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = x + self.attention(x)
        h = rms_norm(x, self.post_attention_norm, self.s.rms_eps)
        if not self.moe:
            return x + F.linear(F.silu(F.linear(h, self.ffn_gate)) * F.linear(h, self.ffn_up), self.ffn_down), None
        ffn, ids = self.moe_ffn(h)
        return x + ffn, ids


class DemoModel(nn.Module):
    """Trunk and NextN block; the NextN block shares the trunk's embedding and output head (DeepSeek-V3 style)."""

    def __init__(self, s: DemoShape):
        super().__init__()
        self.s = s
        out_std = 0.02 / (2 * (s.n_layer + s.n_nextn)) ** 0.5
        self.token_embd = _param(s.n_vocab, s.n_embd, std=0.02)
        self.blocks = nn.ModuleList(Block(s, i >= s.n_dense_lead, out_std) for i in range(s.n_layer))
        self.output_norm = _param(s.n_embd, ones=True)
        self.output = _param(s.n_vocab, s.n_embd, std=0.02)
        d = s.n_embd
        self.eh_proj = _param(d, 2 * d, std=0.02)
        self.enorm, self.hnorm = _param(d, ones=True), _param(d, ones=True)
        self.nextn = Block(s, True, out_std)
        self.shared_head_norm = _param(d, ones=True)

    def trunk(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """tokens [B, T] -> logits [B, T, V], normed hidden [B, T, d], expert ids per MoE layer."""
        x = F.embedding(tokens, self.token_embd)
        routes = []
        for block in self.blocks:
            x, ids = block(x)
            if ids is not None:
                routes.append(ids)
        hidden = rms_norm(x, self.output_norm, self.s.rms_eps)
        return F.linear(hidden, self.output), hidden, routes

    def mtp(self, hidden: torch.Tensor, next_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [B, T, d] at t and tokens [B, T] at t+1 -> logits for t+2, as runner/models/nextn.py."""
        s = self.s
        e = rms_norm(F.embedding(next_tokens, self.token_embd), self.enorm, s.rms_eps)
        h = rms_norm(hidden, self.hnorm, s.rms_eps)
        x = F.linear(torch.cat([e, h], dim=-1), self.eh_proj)
        x, ids = self.nextn(x)
        out = rms_norm(x, self.shared_head_norm, s.rms_eps)
        return F.linear(out, self.output), ids

    def gguf_parameters(self) -> dict[str, torch.Tensor]:
        """Every live tensor (parameters and the routing biases) under its GGUF name.

        nextn.embed_tokens and nextn.shared_head_head are not among them: the block shares the trunk's.
        """
        out = {"token_embd.weight": self.token_embd}
        for i, block in enumerate([*self.blocks, self.nextn]):
            out.update({f"blk.{i}.{name}": t for name, t in _block_tensors(block).items()})
        n = self.s.n_layer
        out[f"blk.{n}.nextn.eh_proj.weight"] = self.eh_proj
        out[f"blk.{n}.nextn.enorm.weight"] = self.enorm
        out[f"blk.{n}.nextn.hnorm.weight"] = self.hnorm
        out[f"blk.{n}.nextn.shared_head_norm.weight"] = self.shared_head_norm
        out["output_norm.weight"] = self.output_norm
        out["output.weight"] = self.output
        return out


def _block_tensors(b: Block) -> dict[str, torch.Tensor]:
    t = {"attn_norm.weight": b.attn_norm, "attn_q.weight": b.attn_q, "attn_q.bias": b.attn_q_b,
         "attn_k.weight": b.attn_k, "attn_k.bias": b.attn_k_b, "attn_v.weight": b.attn_v, "attn_v.bias": b.attn_v_b,
         "attn_output.weight": b.attn_output, "post_attention_norm.weight": b.post_attention_norm}
    if not b.moe:
        t.update({"ffn_gate.weight": b.ffn_gate, "ffn_up.weight": b.ffn_up, "ffn_down.weight": b.ffn_down})
        return t
    t.update({"ffn_gate_inp.weight": b.ffn_gate_inp, "exp_probs_b.bias": b.exp_probs_b,
              "ffn_gate_exps.weight": b.ffn_gate_exps, "ffn_up_exps.weight": b.ffn_up_exps,
              "ffn_down_exps.weight": b.ffn_down_exps, "ffn_gate_shexp.weight": b.ffn_gate_shexp,
              "ffn_up_shexp.weight": b.ffn_up_shexp, "ffn_down_shexp.weight": b.ffn_down_shexp})
    return t
