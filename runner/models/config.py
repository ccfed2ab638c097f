"""ModelConfig: the hyperparameters of a supported architecture, read once from GGUF metadata."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from runner.errors import ModelFileError
from runner.gguf_file import GGUFFile
from runner.models.delta_net_config import DeltaNetConfig, delta_net_config
from runner.models.family import Family
from runner.models.glm4moe import GLM4MOE
from runner.models.qwen3moe import QWEN3MOE
from runner.models.qwen3next import QWEN3NEXT
from runner.models.qwen35moe import QWEN35MOE

FAMILIES: dict[str, Family] = {f.arch: f for f in (GLM4MOE, QWEN3MOE, QWEN35MOE, QWEN3NEXT)}
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
    n_ff_shexp: int = 0  # shared expert width when the file gives it (expert_shared_feed_forward_length)
    rope_sections: tuple[int, ...] | None = None  # multi-section rotary (qwen35moe); None: plain NEOX
    delta_net: DeltaNetConfig | None = None  # hybrid families: the Gated DeltaNet layers' shape

    def __post_init__(self) -> None:
        if self.n_head % self.n_head_kv:
            raise ModelFileError(f"head_count {self.n_head} is not a multiple of head_count_kv {self.n_head_kv}")
        if not 0 < self.n_rot <= self.head_dim or self.n_rot % 2:
            raise ModelFileError(f"rope.dimension_count {self.n_rot} must be even and in 1..{self.head_dim}")
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ModelFileError(f"expert_used_count {self.n_expert_used} must be in 1..{self.n_expert}")
        if self.n_expert_groups > 1 and (
            self.n_expert % self.n_expert_groups or not 1 <= self.n_group_used <= self.n_expert_groups
        ):
            raise ModelFileError(f"expert groups {self.n_expert_groups}/{self.n_group_used} do not divide the experts")
        sections = self.rope_sections
        if sections is not None and (len(sections) != 4 or min(sections) < 0 or not 0 < sum(sections) <= self.n_rot // 2):
            raise ModelFileError(f"rope.dimension_sections {list(self.rope_sections)} must be 4 counts summing to "
                                 f"1..{self.n_rot // 2} (rotary pairs)")

    @property
    def family(self) -> Family:
        return FAMILIES[self.arch]

    @property
    def n_layer_all(self) -> int:
        return self.n_layer + self.n_nextn

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.n_dense_lead

    def is_recurrent(self, layer: int) -> bool:
        """A Gated DeltaNet layer (hybrid families); NextN blocks and every other layer are attention."""
        return self.delta_net is not None and layer < self.n_layer and self.delta_net.recurrent[layer]


def model_config(f: GGUFFile) -> ModelConfig:
    """Build the config for the file's architecture, or say which architectures are supported."""
    arch = f.architecture
    family = FAMILIES.get(arch)
    if family is None:
        raise ModelFileError(
            f"{f.path.name}: unsupported architecture '{arch}'; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    rope_scaling = f.text(f"{arch}.rope.scaling.type", "none")
    if rope_scaling not in ("none", ""):
        raise ModelFileError(f"{f.path.name}: rope scaling '{rope_scaling}' is not supported")

    def count(name: str, default: object = ..., minimum: int = 1) -> int:
        return f.integer(f"{arch}.{name}", default, minimum)

    def number(name: str, default: object = ..., positive: bool = True) -> float:
        return f.number(f"{arch}.{name}", default, positive)

    n_embd = count("embedding_length")
    n_head = count("attention.head_count")
    if f"{arch}.attention.key_length" not in f.metadata and n_embd % n_head:
        raise ModelFileError(
            f"{f.path.name}: embedding_length {n_embd} is not a multiple of head_count {n_head} (and no key_length)"
        )
    head_dim = count("attention.key_length", n_embd // n_head)
    value_dim = count("attention.value_length", head_dim)
    if value_dim != head_dim:
        raise ModelFileError(f"{f.path.name}: key_length {head_dim} != value_length {value_dim} is not supported")
    n_layer_all = count("block_count")
    n_nextn = count("nextn_predict_layers", 0, minimum=0) if family.nextn else 0
    if n_nextn >= n_layer_all:
        raise ModelFileError(
            f"{f.path.name}: nextn_predict_layers {n_nextn} leaves no trunk of block_count {n_layer_all}"
        )
    n_dense_lead = count("leading_dense_block_count", 0, minimum=0) if family.leading_dense else 0
    if n_dense_lead >= n_layer_all - n_nextn:
        raise ModelFileError(
            f"{f.path.name}: leading_dense_block_count {n_dense_lead} leaves no MoE layer in {n_layer_all - n_nextn}"
        )
    embd = f.tensor("token_embd.weight")
    gating_id = count("expert_gating_func", family.gating_default, minimum=0)
    if gating_id not in (1, 2):
        raise ModelFileError(f"{f.path.name}: expert_gating_func {gating_id} is not supported (1 softmax, 2 sigmoid)")
    # Both widths may be per-layer arrays (llama.cpp's get_key_or_arr); its loaders size every layer by
    # the first entry (n_ff(), n_ff_exp()), so a later entry that differs changes nothing there either.
    n_ff = _first_entry(f, f"{arch}.feed_forward_length", n_layer_all, 0)
    if n_dense_lead and not n_ff:
        raise ModelFileError(f"{f.path.name}: feed_forward_length must be at least 1 for the "
                             f"{n_dense_lead} leading dense layers")
    n_expert_used = count("expert_used_count")
    n_ff_exp = _first_entry(f, f"{arch}.expert_feed_forward_length", n_layer_all,
                            ... if family.expert_width_required else 0)
    if not n_ff_exp:  # llama.cpp: n_ff_exp() ? n_ff_exp() : n_ff / n_expert_used
        n_ff_exp = n_ff // n_expert_used
        if not n_ff_exp:
            raise ModelFileError(f"{f.path.name}: no expert width: expert_feed_forward_length is 0 or absent and "
                                 f"feed_forward_length {n_ff} / expert_used_count {n_expert_used} is 0")
    return ModelConfig(
        arch=arch,
        n_vocab=embd.shape[0],
        n_embd=n_embd,
        n_layer=n_layer_all - n_nextn,
        n_nextn=n_nextn,
        n_head=n_head,
        n_head_kv=count("attention.head_count_kv", n_head),
        head_dim=head_dim,
        n_rot=count("rope.dimension_count", head_dim),
        rope_base=number("rope.freq_base", 10000.0),
        rms_eps=number("attention.layer_norm_rms_epsilon"),
        n_ctx_train=count("context_length"),
        n_ff=n_ff,
        n_expert=count("expert_count"),
        n_expert_used=n_expert_used,
        n_ff_exp=n_ff_exp,
        n_expert_shared=_shared_expert_count(family, count),
        n_dense_lead=n_dense_lead,
        gating="sigmoid" if gating_id == 2 else "softmax",
        expert_weights_norm=f.flag(f"{arch}.expert_weights_norm", False) if family.weights_norm_from_file else True,
        expert_weights_scale=number("expert_weights_scale", 0.0, positive=False),
        n_expert_groups=count("expert_group_count", 0, minimum=0),
        n_group_used=count("expert_group_used_count", 0, minimum=0),
        n_ff_shexp=count("expert_shared_feed_forward_length", 0, minimum=0),
        rope_sections=f.integers(f"{arch}.rope.dimension_sections", 4) if family.rope_sections else None,
        delta_net=(delta_net_config(f, arch, family.value_heads, n_layer_all - n_nextn, n_layer_all)
                   if family.value_heads is not None else None),
    )


def _first_entry(f: GGUFFile, key: str, n_layer_all: int, default: object) -> int:
    """A width given as one integer or as an array of one per block (trunk and NextN): the first entry."""
    values = f.integers(key, n_layer_all, None)
    if values is None:
        return f.integer(key, default)  # absent: the default, or the missing-key error when it is required
    if min(values) < 0:
        raise ModelFileError(f"{f.path.name}: metadata key '{key}' has a negative entry {min(values)}")
    return values[0]


def _shared_expert_count(family: Family, count: Callable[..., int]) -> int:
    if family.hybrid:
        return 1  # one gated shared expert in every layer: llama.cpp requires its tensors
    return count("expert_shared_count", 0, minimum=0) if family.shared_experts else 0
