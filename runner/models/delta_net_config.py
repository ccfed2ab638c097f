"""The Gated DeltaNet hyperparameters of a hybrid file (qwen35moe, qwen3next), read as llama.cpp reads them."""

from __future__ import annotations

from dataclasses import dataclass

from runner.errors import ModelFileError
from runner.gguf_file import GGUFFile
from runner.models.family import ValueHeadOrder


@dataclass(frozen=True, slots=True)
class DeltaNetConfig:
    conv_kernel: int  # ssm.conv_kernel: taps of the causal short convolution over q, k, v
    head_dim: int  # ssm.state_size: key and value head width (the recurrent state is head_dim^2 per value head)
    n_k_heads: int  # ssm.group_count
    n_v_heads: int  # ssm.time_step_rank: a multiple of n_k_heads
    value_heads: ValueHeadOrder  # which key head each value head reads (the family's file order)
    recurrent: tuple[bool, ...]  # per trunk layer: DeltaNet (True) or gated full attention

    def __post_init__(self) -> None:
        if self.conv_kernel < 2:
            raise ModelFileError(f"ssm.conv_kernel {self.conv_kernel} must be at least 2")
        if self.n_v_heads % self.n_k_heads:
            raise ModelFileError(f"ssm.time_step_rank {self.n_v_heads} is not a multiple of "
                                 f"ssm.group_count {self.n_k_heads}")

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the short convolution: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim


def delta_net_config(f: GGUFFile, arch: str, value_heads: ValueHeadOrder, n_layer: int,
                     n_layer_all: int) -> DeltaNetConfig:
    """Read the ssm.* keys and which trunk layers are recurrent (attention.recurrent_layers, else every
    layer but each full_attention_interval-th); NextN blocks are always full attention."""
    name = f.path.name

    def count(key: str) -> int:
        return f.integer(f"{arch}.{key}", minimum=1)

    head_dim = count("ssm.state_size")
    n_v_heads = count("ssm.time_step_rank")
    inner = count("ssm.inner_size")
    if inner != head_dim * n_v_heads:
        raise ModelFileError(f"{name}: ssm.inner_size {inner} is not ssm.state_size {head_dim} x "
                             f"ssm.time_step_rank {n_v_heads}")
    flags = f.integers(f"{arch}.attention.recurrent_layers", n_layer_all, None)
    if flags is None:
        interval = f.integer(f"{arch}.full_attention_interval", 4, minimum=1)
        flags = tuple(int((i + 1) % interval != 0) for i in range(n_layer_all))
    elif any(flags[n_layer:]):
        raise ModelFileError(f"{name}: attention.recurrent_layers marks a NextN block recurrent")
    recurrent = tuple(bool(v) for v in flags[:n_layer])
    return DeltaNetConfig(
        conv_kernel=count("ssm.conv_kernel"),
        head_dim=head_dim,
        n_k_heads=count("ssm.group_count"),
        n_v_heads=n_v_heads,
        value_heads=value_heads,
        recurrent=recurrent,
    )
