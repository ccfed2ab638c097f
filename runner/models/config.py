"""ModelConfig: the hyperparameters of a supported architecture, read once from GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from runner.errors import ModelFileError
from runner.gguf_file import GGUFFile
from runner.models.family import Family
from runner.models.glm4moe import GLM4MOE
from runner.models.qwen3moe import QWEN3MOE

FAMILIES: dict[str, Family] = {f.arch: f for f in (GLM4MOE, QWEN3MOE)}
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)

Gating = Literal["sigmoid", "softmax"]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    arch: str
    n_vocab: int
    n_embd: int
    n_layer: int  # trunk layers; NextN blocks follow them in the file
    n_nextn: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int  # rotary dimensions per head (partial rotary when < head_dim), NEOX layout
    rope_base: float
    rms_eps: float
    n_ctx_train: int
    n_ff: int  # dense FFN width of the leading dense layers
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_expert_shared: int
    n_dense_lead: int
    gating: Gating
    expert_weights_norm: bool
    expert_weights_scale: float  # 0 means no scaling, as in llama.cpp
    n_expert_groups: int
    n_group_used: int

    def __post_init__(self) -> None:
        if self.n_head % self.n_head_kv:
            raise ModelFileError(f"head_count {self.n_head} is not a multiple of head_count_kv {self.n_head_kv}")
        if not 0 < self.n_rot <= self.head_dim or self.n_rot % 2:
            raise ModelFileError(f"rope.dimension_count {self.n_rot} must be even and in 1..{self.head_dim}")
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ModelFileError(f"expert_used_count {self.n_expert_used} must be in 1..{self.n_expert}")
        if self.n_expert_groups > 1 and (self.n_expert % self.n_expert_groups or self.n_group_used < 1):
            raise ModelFileError(f"expert groups {self.n_expert_groups}/{self.n_group_used} do not divide the experts")

    @property
    def family(self) -> Family:
        return FAMILIES[self.arch]

    @property
    def n_layer_all(self) -> int:
        return self.n_layer + self.n_nextn

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.n_dense_lead


def model_config(f: GGUFFile) -> ModelConfig:
    """Build the config for the file's architecture, or say which architectures are supported."""
    arch = f.architecture
    family = FAMILIES.get(arch)
    if family is None:
        raise ModelFileError(
            f"{f.path.name}: unsupported architecture '{arch}'; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    rope_scaling = f.get(f"{arch}.rope.scaling.type", "none")
    if rope_scaling not in ("none", ""):
        raise ModelFileError(f"{f.path.name}: rope scaling '{rope_scaling}' is not supported")

    def key(name: str, default: object = ...) -> object:
        full = f"{arch}.{name}"
        if default is ...:
            return f.require(full)
        return f.get(full, default)

    n_embd = int(key("embedding_length"))
    n_head = int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", n_embd // n_head))
    value_dim = int(key("attention.value_length", head_dim))
    if value_dim != head_dim:
        raise ModelFileError(f"{f.path.name}: key_length {head_dim} != value_length {value_dim} is not supported")
    n_nextn = int(key("nextn_predict_layers", 0)) if family.nextn else 0
    n_layer_all = int(key("block_count"))
    embd = f.tensor("token_embd.weight")
    gating_id = int(key("expert_gating_func", family.gating_default))
    if gating_id not in (1, 2):
        raise ModelFileError(f"{f.path.name}: expert_gating_func {gating_id} is not supported (1 softmax, 2 sigmoid)")
    return ModelConfig(
        arch=arch,
        n_vocab=embd.shape[0],
        n_embd=n_embd,
        n_layer=n_layer_all - n_nextn,
        n_nextn=n_nextn,
        n_head=n_head,
        n_head_kv=int(key("attention.head_count_kv", n_head)),
        head_dim=head_dim,
        n_rot=int(key("rope.dimension_count", head_dim)),
        rope_base=float(key("rope.freq_base", 10000.0)),
        rms_eps=float(key("attention.layer_norm_rms_epsilon")),
        n_ctx_train=int(key("context_length")),
        n_ff=int(key("feed_forward_length", 0)),
        n_expert=int(key("expert_count")),
        n_expert_used=int(key("expert_used_count")),
        n_ff_exp=int(key("expert_feed_forward_length")),
        n_expert_shared=int(key("expert_shared_count", 0)) if family.shared_experts else 0,
        n_dense_lead=int(key("leading_dense_block_count", 0)) if family.leading_dense else 0,
        gating="sigmoid" if gating_id == 2 else "softmax",
        expert_weights_norm=bool(key("expert_weights_norm", False)) if family.weights_norm_from_file else True,
        expert_weights_scale=float(key("expert_weights_scale", 0.0)),
        n_expert_groups=int(key("expert_group_count", 0)),
        n_group_used=int(key("expert_group_used_count", 0)),
    )
