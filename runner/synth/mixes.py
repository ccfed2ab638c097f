"""Per-tensor quant types for llama.cpp file-type names (Q4_K_M, ...): simplified llama_tensor_get_type."""

from __future__ import annotations

import re

from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT

from runner.errors import SynthError

_FLOATS = (QT.F32, QT.F16, QT.BF16)

_MIX_BASE: dict[str, QT] = {
    "F32": QT.F32, "F16": QT.F16, "BF16": QT.BF16,
    "Q8_0": QT.Q8_0, "Q4_0": QT.Q4_0, "Q4_1": QT.Q4_1, "Q5_0": QT.Q5_0, "Q5_1": QT.Q5_1,
    "Q2_K": QT.Q2_K, "Q3_K_S": QT.Q3_K, "Q3_K_M": QT.Q3_K, "Q3_K_L": QT.Q3_K,
    "Q4_K_S": QT.Q4_K, "Q4_K_M": QT.Q4_K, "Q5_K_S": QT.Q5_K, "Q5_K_M": QT.Q5_K, "Q6_K": QT.Q6_K,
    "IQ4_NL": QT.IQ4_NL, "IQ4_XS": QT.IQ4_XS, "MXFP4": QT.MXFP4, "MXFP4_MOE": QT.MXFP4,
}
MIX_NAMES: tuple[str, ...] = tuple(_MIX_BASE)

# tensor_type_fallback: what llama.cpp stores when a row is not a whole number of blocks
_FALLBACK: dict[QT, QT] = {
    QT.IQ4_XS: QT.IQ4_NL, QT.Q2_K: QT.Q4_0, QT.Q3_K: QT.Q4_0,
    QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0,
}
_LAYER = re.compile(r"^blk\.(\d+)\.")


def _use_more_bits(i: int, n: int) -> bool:
    # llama.cpp's choice of layers that get more bits: first and last eighth, every third between
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def mix_qtype(mix: str, tensor_name: str, n_layer: int, *, shape: tuple[int, ...] | None = None) -> QT:
    """The type llama-quantize would give `tensor_name` in a file of type `mix` (e.g. "Q4_K_M").

    Rules kept from llama.cpp (simplified):
    - never quantized, always F32: 1-D tensors, names not ending in "weight", norms ("norm.weight"),
      biases, the router (ffn_gate_inp.weight), exp_probs_b and DeltaNet's ssm_conv1d;
    - float file types (F32/F16/BF16) use that type for every other tensor;
    - output.weight: Q6_K (Q8_0 stays Q8_0; MXFP4 files and rows not a multiple of the block: Q8_0);
      token_embd.weight keeps the base type (assumes a separate output.weight, i.e. untied);
    - MXFP4(_MOE): expert tensors ("_exps") MXFP4, everything else Q8_0;
    - attn_v / attn_qkv / attn_kv_b, counted by layer index: Q4_K_M, Q5_K_M -> Q6_K on use_more_bits
      layers; Q4_K_S -> Q5_K on layers < 4; Q3_K_M -> Q5_K on layers < 2, else Q4_K; Q3_K_L -> Q5_K;
      Q2_K, IQ4_NL, IQ4_XS -> Q4_K / Q5_K (llama.cpp's rule for GQA >= 4, true of current models);
    - ffn_down* (dense, _exps and _shexp alike, layer from the name): Q4_K_M, Q5_K_M -> Q6_K on
      use_more_bits layers; Q4_K_S -> Q5_K and IQ4_NL/IQ4_XS -> Q5_K (no imatrix) on layers
      < n_layer/8; Q3_K_M -> Q5_K on layers < n_layer/16 else Q4_K; Q3_K_L -> Q5_K; Q2_K -> Q3_K;
    - attn_output: Q2_K -> Q3_K, Q3_K_M -> Q4_K, Q3_K_L -> Q5_K;
    - left out: 8-expert (Mixtral) and Falcon special cases, imatrix-only rules, tied embeddings.
    With `shape` given, 1-D tensors are F32 and rows that are not whole blocks fall back as
    llama.cpp's tensor_type_fallback does (Q4_K -> Q5_0, Q6_K -> Q8_0, ..., else F16).
    """
    key = mix.upper()
    if key not in _MIX_BASE:
        raise SynthError(f"unknown quant mix '{mix}'; choose from {', '.join(MIX_NAMES)}")
    base = _MIX_BASE[key]
    name = tensor_name
    if (
        (shape is not None and len(shape) < 2)
        or not name.endswith("weight")
        or name.endswith("norm.weight")
        or "ffn_gate_inp.weight" in name
        or "exp_probs_b" in name
        or "ssm_conv1d" in name
    ):
        return QT.F32
    if base in _FLOATS:
        return base
    chosen = _mix_rule(key, base, name, n_layer)
    if shape is None:
        return chosen
    return _fallback(chosen, shape[-1], name == "output.weight")


def _mix_rule(mix: str, base: QT, name: str, n_layer: int) -> QT:
    if name == "output.weight":
        return QT.Q8_0 if base in (QT.Q8_0, QT.MXFP4) else QT.Q6_K
    if base == QT.MXFP4:
        return QT.MXFP4 if "_exps" in name else QT.Q8_0
    match = _LAYER.match(name)
    if match is None:  # token_embd and other non-layer tensors keep the base type
        return base
    i = int(match.group(1))
    if not 0 <= i < n_layer:
        raise SynthError(f"tensor {name} has layer {i}, outside 0..{n_layer - 1}")
    if any(part in name for part in ("attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight")):
        return _attn_v_rule(mix, base, i, n_layer)
    if "ffn_down" in name:
        return _ffn_down_rule(mix, base, i, n_layer)
    if "attn_output.weight" in name:
        return {"Q2_K": QT.Q3_K, "Q3_K_M": QT.Q4_K, "Q3_K_L": QT.Q5_K}.get(mix, base)
    return base


def _attn_v_rule(mix: str, base: QT, i: int, n: int) -> QT:
    if mix in ("Q4_K_M", "Q5_K_M"):
        return QT.Q6_K if _use_more_bits(i, n) else base
    if mix == "Q4_K_S":
        return QT.Q5_K if i < 4 else base
    if mix == "Q3_K_M":
        return QT.Q5_K if i < 2 else QT.Q4_K
    return {"Q3_K_L": QT.Q5_K, "Q2_K": QT.Q4_K, "IQ4_NL": QT.Q5_K, "IQ4_XS": QT.Q5_K}.get(mix, base)


def _ffn_down_rule(mix: str, base: QT, i: int, n: int) -> QT:
    if mix in ("Q4_K_M", "Q5_K_M"):
        return QT.Q6_K if _use_more_bits(i, n) else base
    if mix in ("Q4_K_S", "IQ4_NL", "IQ4_XS"):
        return QT.Q5_K if i < n // 8 else base
    if mix == "Q3_K_M":
        return QT.Q5_K if i < n // 16 else QT.Q4_K
    return {"Q3_K_L": QT.Q5_K, "Q2_K": QT.Q3_K}.get(mix, base)


def _fallback(qtype: QT, row_length: int, is_output: bool) -> QT:
    block = GGML_QUANT_SIZES[qtype][0]
    if row_length % block == 0:
        return qtype
    chosen = QT.Q8_0 if is_output else _FALLBACK.get(qtype, qtype)
    return chosen if row_length % GGML_QUANT_SIZES[chosen][0] == 0 else QT.F16
