"""What a model file holds, in the terms the offload runner plans with: resident bytes vs routed experts."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

from runner.gguf_file import GGUFFile
from runner.models.config import ModelConfig, model_config
from runner.models.weights import MoEWeights, is_routed_expert, load_weights
from runner.units import size_text


@dataclass(frozen=True)
class ModelInfo:
    file: str  # of a split model, its first shard
    shards: int  # files of a split model (gguf-split), 1 for a single file
    architecture: str
    config: dict
    file_bytes: int  # all shards together
    tensor_bytes: int
    resident_bytes: int  # everything except routed experts: lives on the GPU
    routed_expert_bytes: int  # the whole routed expert set: lives in host RAM
    routed_expert_bytes_per_layer: dict[int, int]
    expert_slot_bytes: int  # gate + up + down of one expert, largest layer
    quant_mix: dict[str, dict[str, int]]  # qtype -> {"tensors": n, "bytes": b}
    has_nextn: bool

    def to_dict(self) -> dict:
        return asdict(self)


def model_info(f: GGUFFile) -> ModelInfo:
    cfg: ModelConfig = model_config(f)
    weights = load_weights(f, cfg)
    per_layer: dict[int, int] = {}
    slot = 0
    for i, lw in enumerate([*weights.layers, *(n.layer for n in weights.nextn)]):
        if isinstance(lw.ffn, MoEWeights):
            exps = (lw.ffn.gate_exps, lw.ffn.up_exps, lw.ffn.down_exps)
            per_layer[i] = sum(t.nbytes for t in exps)
            slot = max(slot, sum(t.nbytes // t.shape[0] for t in exps))
    mix: Counter[str] = Counter()
    mix_bytes: Counter[str] = Counter()
    for t in f.tensors.values():
        mix[t.qtype.name] += 1
        mix_bytes[t.qtype.name] += t.nbytes
    total = sum(t.nbytes for t in f.tensors.values())
    routed = sum(t.nbytes for t in f.tensors.values() if is_routed_expert(t.name))
    return ModelInfo(
        file=str(f.path),
        shards=len(f.shards),
        architecture=cfg.arch,
        config=asdict(cfg),
        file_bytes=f.file_bytes,
        tensor_bytes=total,
        resident_bytes=total - routed,
        routed_expert_bytes=routed,
        routed_expert_bytes_per_layer=per_layer,
        expert_slot_bytes=slot,
        quant_mix={k: {"tensors": mix[k], "bytes": mix_bytes[k]} for k in sorted(mix)},
        has_nextn=cfg.n_nextn > 0,
    )


def format_info(info: ModelInfo) -> str:
    c = info.config
    per_layer = list(info.routed_expert_bytes_per_layer.values())
    size = size_text(info.file_bytes)
    if info.shards > 1:
        size = f"{info.shards} shards, {size} in all"
    lines = [
        f"file          {info.file} ({size})",
        f"architecture  {info.architecture}",
        f"layers        {c['n_layer']} trunk ({c['n_dense_lead']} dense) + {c['n_nextn']} NextN",
        f"hidden        {c['n_embd']}, heads {c['n_head']}/{c['n_head_kv']} of {c['head_dim']}, rotary {c['n_rot']}",
        f"experts       {c['n_expert']} of width {c['n_ff_exp']}, top-{c['n_expert_used']}, "
        f"{c['n_expert_shared']} shared, {c['gating']} routing",
        f"vocabulary    {c['n_vocab']}, context {c['n_ctx_train']}",
        *_delta_net_lines(c),
        f"resident      {size_text(info.resident_bytes)} "
        "(attention, norms, router, shared experts, dense layers, head)",
        f"routed set    {size_text(info.routed_expert_bytes)} total, "
        f"{size_text(max(per_layer, default=0))} per MoE layer",
        f"expert slot   {size_text(info.expert_slot_bytes)} (gate + up + down of one expert)",
        "quant mix     " + ", ".join(f"{k} {v['tensors']} ({size_text(v['bytes'])})"
                                     for k, v in info.quant_mix.items()),
    ]
    return "\n".join(lines)


def _delta_net_lines(c: dict) -> list[str]:
    """The hybrid families' layer mix and Gated DeltaNet shape (nothing for attention-only models)."""
    dn = c["delta_net"]
    if dn is None:
        return []
    n_delta = sum(dn["recurrent"])
    line = (f"delta net     {n_delta} of {c['n_layer']} layers (the rest gated attention), {dn['n_k_heads']} key / "
            f"{dn['n_v_heads']} value heads ({dn['value_heads']}) of {dn['head_dim']}, conv {dn['conv_kernel']}")
    return [line]
