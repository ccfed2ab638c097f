"""The model's tensors, found by their GGUF names and checked for shape, grouped per layer."""

from __future__ import annotations

from dataclasses import dataclass

from runner.errors import ModelFileError
from runner.gguf_file import GGUFFile, TensorInfo
from runner.models.config import ModelConfig
from runner.models.delta_net_weights import DeltaNetWeights, delta_net_weights

ROUTED_SUFFIXES = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight", "ffn_gate_up_exps.weight")


def is_routed_expert(name: str) -> bool:
    """A routed expert tensor: what expert offload keeps in host RAM instead of on the GPU."""
    return name.endswith(ROUTED_SUFFIXES)


@dataclass(frozen=True)
class FFNWeights:
    gate: TensorInfo  # [n_ff, n_embd]
    up: TensorInfo  # [n_ff, n_embd]
    down: TensorInfo  # [n_embd, n_ff]


@dataclass(frozen=True)
class MoEWeights:
    router: TensorInfo  # [n_expert, n_embd]
    probs_bias: TensorInfo | None  # [n_expert], selection-only correction bias (glm4moe)
    gate_exps: TensorInfo  # [n_expert, n_ff_exp, n_embd]
    up_exps: TensorInfo  # [n_expert, n_ff_exp, n_embd]
    down_exps: TensorInfo  # [n_expert, n_embd, n_ff_exp]
    shared: FFNWeights | None
    shared_gate: TensorInfo | None = None  # [n_embd]: the shared expert's output scaled by sigmoid(x . gate)


@dataclass(frozen=True)
class AttentionWeights:
    wq: TensorInfo  # gated attention (hybrid families): per head the query then its output gate
    wk: TensorInfo
    wv: TensorInfo
    wo: TensorInfo
    bq: TensorInfo | None
    bk: TensorInfo | None
    bv: TensorInfo | None
    q_norm: TensorInfo | None  # [head_dim], per-head RMSNorm
    k_norm: TensorInfo | None


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: TensorInfo
    attn: AttentionWeights | DeltaNetWeights  # DeltaNet: the recurrent layers of hybrid families
    ffn_norm: TensorInfo
    ffn: FFNWeights | MoEWeights


@dataclass(frozen=True)
class NextNWeights:
    layer: LayerWeights
    eh_proj: TensorInfo  # [n_embd, 2 * n_embd]: concat(enorm(embed), hnorm(hidden)) -> n_embd
    enorm: TensorInfo
    hnorm: TensorInfo
    embed: TensorInfo  # nextn.embed_tokens, else token_embd
    head_norm: TensorInfo  # nextn.shared_head_norm, else output_norm
    head: TensorInfo  # nextn.shared_head_head, else output


@dataclass(frozen=True)
class ModelWeights:
    token_embd: TensorInfo
    output_norm: TensorInfo
    output: TensorInfo
    layers: tuple[LayerWeights, ...]
    nextn: tuple[NextNWeights, ...]

    def all_tensors(self) -> list[TensorInfo]:
        seen: dict[str, TensorInfo] = {}

        def visit(obj: object) -> None:
            if isinstance(obj, TensorInfo):
                seen.setdefault(obj.name, obj)
            elif isinstance(obj, tuple):
                for item in obj:
                    visit(item)
            elif obj is not None and hasattr(obj, "__dataclass_fields__"):
                for name in obj.__dataclass_fields__:
                    visit(getattr(obj, name))

        visit(self)
        return list(seen.values())


class _Finder:
    """Looks tensors up by name and checks each one's shape against the config; remembers what it found."""

    def __init__(self, f: GGUFFile):
        self.f = f
        self.found: set[str] = set()

    def get(self, name: str, shape: tuple[int, ...]) -> TensorInfo:
        info = self.f.tensor(name)
        self.found.add(name)
        if info.shape != shape:
            raise ModelFileError(
                f"{self.f.path.name}: tensor '{name}' has shape {list(info.shape)}, expected {list(shape)}"
            )
        return info

    def optional(self, name: str, shape: tuple[int, ...]) -> TensorInfo | None:
        return self.get(name, shape) if self.f.has_tensor(name) else None

    def split(self, name: str, shape: tuple[int, ...], parts: dict[str, int]) -> list[TensorInfo]:
        """A fused tensor cut along its rows (a vector: its only axis) into views named as the separate
        tensors would be ({name: rows}, in order); nothing is copied.

        Every consumer takes views as it takes file tensors: numpy reads them in place, the CUDA backend
        and the host expert arena copy their bytes into buffers of their own (so the addresses kernels
        read are of contiguous copies, never of the fused tensor's strided rows)."""
        info = self.get(name, shape)
        axis = max(len(shape) - 2, 0)
        assert sum(parts.values()) == shape[axis], f"{name}: parts {parts} do not cover {shape[axis]} rows"
        views, start = [], 0
        for part, rows in parts.items():
            cut = (slice(None),) * axis + (slice(start, start + rows),)
            views.append(TensorInfo(name=part, qtype=info.qtype, shape=(*shape[:axis], rows, *shape[axis + 1 :]),
                                    data=info.data[cut], offset=info.offset + start * info.data.strides[axis]))
            start += rows
        return views


def load_weights(f: GGUFFile, cfg: ModelConfig) -> ModelWeights:
    """Find and shape-check every tensor the forward pass uses (views only; nothing is read)."""
    t = _Finder(f)
    d, v = cfg.n_embd, cfg.n_vocab
    token_embd = t.get("token_embd.weight", (v, d))
    output_norm = t.get("output_norm.weight", (d,))
    output = t.optional("output.weight", (v, d)) or token_embd
    layers = tuple(_layer(t, cfg, i) for i in range(cfg.n_layer))
    nextn = tuple(_nextn(t, cfg, i, token_embd, output_norm, output) for i in range(cfg.n_layer, cfg.n_layer_all))
    # A tensor nothing looked up is a misspelled name or another architecture's: refuse it rather than
    # run a model without a weight the file meant it to have.
    unknown = [name for name in f.tensors if name not in t.found]
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise ModelFileError(
            f"{f.path.name}: unknown tensor '{unknown[0]}'{more}: "
            f"{cfg.arch} with {cfg.n_layer_all} blocks has no such weight"
        )
    return ModelWeights(token_embd, output_norm, output, layers, nextn)


def _attention(t: _Finder, cfg: ModelConfig, p: str) -> AttentionWeights:
    """q, k, v apart or fused as attn_qkv (with attn_qkv.bias or the three biases apart), as llama.cpp's
    create_tensor_qkv reads them in every family; hybrids' q rows hold each head's query and output gate."""
    d, hd = cfg.n_embd, cfg.head_dim
    q_dim, kv_dim = cfg.n_head * hd, cfg.n_head_kv * hd
    q_rows = q_dim * (2 if cfg.family.hybrid else 1)
    names = {p + "attn_q.": q_rows, p + "attn_k.": kv_dim, p + "attn_v.": kv_dim}
    weights: list[TensorInfo]
    biases: list[TensorInfo | None]
    if t.f.has_tensor(p + "attn_qkv.weight"):
        weights = t.split(p + "attn_qkv.weight", (q_rows + 2 * kv_dim, d), {n + "weight": r for n, r in names.items()})
        if t.f.has_tensor(p + "attn_qkv.bias"):
            biases = list(t.split(p + "attn_qkv.bias", (q_rows + 2 * kv_dim,), {n + "bias": r for n, r in names.items()}))
        else:  # llama.cpp adds biases kept apart beside a fused weight only when all three are there
            biases = [t.optional(n + "bias", (r,)) for n, r in names.items()]
            biases = biases if all(b is not None for b in biases) else [None, None, None]
    else:
        weights = [t.get(n + "weight", (r, d)) for n, r in names.items()]
        biases = [t.optional(n + "bias", (r,)) for n, r in names.items()]
    return AttentionWeights(
        *weights,
        wo=t.get(p + "attn_output.weight", (d, q_dim)),
        bq=biases[0],
        bk=biases[1],
        bv=biases[2],
        q_norm=t.optional(p + "attn_q_norm.weight", (hd,)),
        k_norm=t.optional(p + "attn_k_norm.weight", (hd,)),
    )


def _gate_up(t: _Finder, cfg: ModelConfig, p: str) -> list[TensorInfo]:
    """The routed experts' gate and up matrices, apart or (hybrid families) fused as ffn_gate_up_exps: per
    expert its gate rows, then its up rows (llama.cpp's build_moe_ffn views the product the same way)."""
    e, fe, d = cfg.n_expert, cfg.n_ff_exp, cfg.n_embd
    fused = p + "ffn_gate_up_exps.weight"
    gate, up = p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight"
    if not t.f.has_tensor(fused):
        return [t.get(gate, (e, fe, d)), t.get(up, (e, fe, d))]
    if not cfg.family.fused_gate_up:
        raise ModelFileError(f"{t.f.path.name}: tensor '{fused}': {cfg.arch} files keep the gate and up experts "
                             f"apart (llama.cpp's {cfg.arch} loader reads no fused ffn_gate_up_exps)")
    return t.split(fused, (e, 2 * fe, d), {gate: fe, up: fe})


def _layer(t: _Finder, cfg: ModelConfig, i: int) -> LayerWeights:
    p = f"blk.{i}."
    d = cfg.n_embd
    attn = delta_net_weights(t, cfg, p) if cfg.is_recurrent(i) else _attention(t, cfg, p)
    ffn: FFNWeights | MoEWeights
    if cfg.is_moe_layer(i):
        e, fe = cfg.n_expert, cfg.n_ff_exp
        router = t.get(p + "ffn_gate_inp.weight", (e, d))
        gate_exps, up_exps = _gate_up(t, cfg, p)
        shared = None
        if cfg.n_expert_shared:
            fs = _shared_width(cfg)
            shared = FFNWeights(
                gate=t.get(p + "ffn_gate_shexp.weight", (fs, d)),
                up=t.get(p + "ffn_up_shexp.weight", (fs, d)),
                down=t.get(p + "ffn_down_shexp.weight", (d, fs)),
            )
        ffn = MoEWeights(
            router=router,
            probs_bias=t.get(p + "exp_probs_b.bias", (e,)) if cfg.family.router_bias else None,
            gate_exps=gate_exps,
            up_exps=up_exps,
            down_exps=t.get(p + "ffn_down_exps.weight", (e, d, fe)),
            shared=shared,
            shared_gate=t.get(p + "ffn_gate_inp_shexp.weight", (d,)) if cfg.family.hybrid else None,
        )
    else:
        ffn = FFNWeights(
            gate=t.get(p + "ffn_gate.weight", (cfg.n_ff, d)),
            up=t.get(p + "ffn_up.weight", (cfg.n_ff, d)),
            down=t.get(p + "ffn_down.weight", (d, cfg.n_ff)),
        )
    return LayerWeights(
        attn_norm=t.get(p + "attn_norm.weight", (d,)),
        attn=attn,
        ffn_norm=t.get(p + cfg.family.ffn_norm, (d,)),
        ffn=ffn,
    )


def _shared_width(cfg: ModelConfig) -> int:
    if cfg.family.hybrid:  # llama.cpp: expert_shared_feed_forward_length, else feed_forward_length
        return cfg.n_ff_shexp or cfg.n_ff
    return cfg.n_ff_exp * cfg.n_expert_shared


def _nextn(
    t: _Finder, cfg: ModelConfig, i: int, token_embd: TensorInfo, output_norm: TensorInfo, output: TensorInfo
) -> NextNWeights:
    p = f"blk.{i}.nextn."
    d, v = cfg.n_embd, cfg.n_vocab
    return NextNWeights(
        layer=_layer(t, cfg, i),
        eh_proj=t.get(p + "eh_proj.weight", (d, 2 * d)),
        enorm=t.get(p + "enorm.weight", (d,)),
        hnorm=t.get(p + "hnorm.weight", (d,)),
        embed=t.optional(p + "embed_tokens.weight", (v, d)) or token_embd,
        head_norm=t.optional(p + "shared_head_norm.weight", (d,)) or output_norm,
        head=t.optional(p + "shared_head_head.weight", (v, d)) or output,
    )
