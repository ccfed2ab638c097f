"""Write a synthetic GGUF of a real architecture: the tensor plan, random weights, metadata, vocabulary.

Small shapes are drawn as float32 and stored as F32/F16/BF16/Q8_0 (or handed to llama.cpp's own
quantizer for a mix). Full-size shapes never exist as floats: each tensor is drawn directly as
random valid quant blocks and written at its offset one tensor at a time, so memory stays flat.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from runner.errors import SynthError
from runner.models.config import FAMILIES
from runner.synth.hybrid_plan import (
    attention_qkv_plan,
    gate_up_plan,
    hybrid_layer_plan,
    write_hybrid_metadata,
)
from runner.synth.presets import SynthShape
from runner.synth.random_blocks import random_tensor
from runner.synth.vocab import build_vocab, write_vocab

# The final logits' standard deviation: wide enough that greedy argmax has clear margins (so
# quantized runs keep the same tokens) and continuations move between many tokens.
LOGIT_STD = 4.0
FLOAT_STORE = {"F32": QT.F32, "F16": QT.F16, "BF16": QT.BF16, "Q8_0": QT.Q8_0}


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    shape: tuple[int, ...]  # numpy order: (..., rows, row_length)
    kind: str  # "embed", "matrix", "output", "norm", "bias", "router"; DeltaNet's "conv" (ssm_conv1d), "decay" (ssm_a)

    @property
    def std(self) -> float:
        return {"embed": 1.0, "norm": 0.1, "bias": 0.1, "output": LOGIT_STD / math.sqrt(self.shape[-1])}.get(
            self.kind, 1.0 / math.sqrt(self.shape[-1])
        )


def tensor_plan(arch: str, s: SynthShape) -> list[PlannedTensor]:
    """Every tensor llama.cpp loads for this architecture and shape, in file order."""
    family = FAMILIES[arch]
    d, q_dim = s.n_embd, s.n_head * s.head_dim
    plan = [PlannedTensor("token_embd.weight", (s.n_vocab, d), "embed")]
    for i in range(s.n_layer + s.n_nextn):
        p = f"blk.{i}."
        add = lambda name, shape, kind="matrix": plan.append(PlannedTensor(p + name, shape, kind))  # noqa: E731
        if family.hybrid:
            plan.extend(PlannedTensor(*t) for t in hybrid_layer_plan(family, s, i))
            if i >= s.n_layer:
                _add_nextn(add, s, own_embed_and_head=False)  # Qwen's MTP shares token_embd and output
            continue
        add("attn_norm.weight", (d,), "norm")
        plan.extend(PlannedTensor(*t) for t in attention_qkv_plan(s, i, q_dim))
        if s.qk_norm:
            add("attn_q_norm.weight", (s.head_dim,), "norm")
            add("attn_k_norm.weight", (s.head_dim,), "norm")
        add("attn_output.weight", (d, q_dim))
        add(family.ffn_norm, (d,), "norm")
        if i < s.n_dense_lead:
            add("ffn_gate.weight", (s.n_ff, d))
            add("ffn_up.weight", (s.n_ff, d))
            add("ffn_down.weight", (d, s.n_ff))
        else:
            e, fe = s.n_expert, s.n_ff_exp
            add("ffn_gate_inp.weight", (e, d), "router")
            if family.router_bias:
                add("exp_probs_b.bias", (e,), "bias")
            plan.extend(PlannedTensor(*t) for t in gate_up_plan(s, i))
            add("ffn_down_exps.weight", (e, d, fe))
            if s.n_expert_shared:
                fs = fe * s.n_expert_shared
                add("ffn_gate_shexp.weight", (fs, d))
                add("ffn_up_shexp.weight", (fs, d))
                add("ffn_down_shexp.weight", (d, fs))
        if i >= s.n_layer:
            _add_nextn(add, s)
    plan.append(PlannedTensor("output_norm.weight", (d,), "norm"))
    plan.append(PlannedTensor("output.weight", (s.n_vocab, d), "output"))
    return plan


def _add_nextn(add: Callable[..., None], s: SynthShape, own_embed_and_head: bool = True) -> None:
    d = s.n_embd
    add("nextn.eh_proj.weight", (d, 2 * d))
    add("nextn.enorm.weight", (d,), "norm")
    add("nextn.hnorm.weight", (d,), "norm")
    if own_embed_and_head:
        add("nextn.embed_tokens.weight", (s.n_vocab, d), "embed")
    add("nextn.shared_head_norm.weight", (d,), "norm")
    if own_embed_and_head:
        add("nextn.shared_head_head.weight", (s.n_vocab, d), "output")


def float_values(rng: np.random.Generator, t: PlannedTensor) -> np.ndarray:
    if t.kind == "decay":  # -exp(A_log) in [-1.5, -0.05]: per-token decays exp(g) from ~0.05 to ~0.99
        return -np.exp(rng.uniform(np.log(0.05), np.log(1.5), t.shape)).astype(np.float32)
    values = rng.standard_normal(t.shape, dtype=np.float32) * np.float32(t.std)
    return values + np.float32(1.0) if t.kind == "norm" else values


def write_metadata(w: gguf.GGUFWriter, arch: str, s: SynthShape, name: str) -> None:
    w.add_name(name)
    w.add_context_length(s.n_ctx)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer + s.n_nextn)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.n_rot)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(FAMILIES[arch].rms_eps_synth)
    w.add_expert_count(s.n_expert)
    w.add_expert_used_count(s.n_expert_used)
    if s.ff_exp_per_layer:
        w.add_array(f"{arch}.expert_feed_forward_length", [s.n_ff_exp] * (s.n_layer + s.n_nextn))
    else:
        w.add_expert_feed_forward_length(s.n_ff_exp)
    if s.expert_weights_scale:
        w.add_expert_weights_scale(s.expert_weights_scale)
    family = FAMILIES[arch]
    if family.hybrid:
        write_hybrid_metadata(w, family, s)
    elif family.shared_experts:
        w.add_expert_shared_count(s.n_expert_shared)
    if family.leading_dense:
        w.add_leading_dense_block_count(s.n_dense_lead)
    if family.weights_norm_from_file:
        w.add_expert_weights_norm(True)
    if family.gating_default == 2:
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if family.nextn:
        w.add_nextn_predict_layers(s.n_nextn)
    write_vocab(w, build_vocab(arch, s.n_vocab))


def write_synthetic(
    path: Path, arch: str, s: SynthShape, qtype_of: Callable[[PlannedTensor], QT], seed: int,
    progress: Callable[[int], None] | None = None, random_blocks: bool = False, jobs: int = 1,
) -> int:
    """Write every planned tensor to `path`; returns the bytes of tensor data written.

    Quantized tensors are random blocks when `random_blocks` (always for full-size shapes), else
    float values quantized by gguf.quants (only the types it implements). Each tensor draws from its
    own generator (seed, index), so `jobs` worker processes drawing ahead give the same file."""
    plan = tensor_plan(arch, s)
    types = [qtype_of(t) for t in plan]
    w = gguf.GGUFWriter(path, arch)
    write_metadata(w, arch, s, f"synthetic {arch} seed {seed}")
    for t, qt in zip(plan, types):
        nbytes = stored_nbytes(t.shape, qt)
        w.add_tensor_info(t.name, _stored_shape(t.shape, qt), _stored_dtype(qt), nbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    # Each tensor at the offset its tensor info names (padded to the alignment, zeros between, as
    # GGUFWriter.write_tensor_data lays them out), written there by whichever process drew it: no tensor
    # crosses a pipe (pickling them through one made 2 workers 3x slower than 1).
    align = w.data_alignment
    start = gguf.GGUFWriter.ggml_pad(w.fout[0].tell(), align)
    w.close()
    offsets, end = [], start
    for t, qt in zip(plan, types):
        offsets.append(end)
        end += gguf.GGUFWriter.ggml_pad(stored_nbytes(t.shape, qt), align)
    with open(path, "r+b") as f:
        f.truncate(end)  # the gaps read as zeros, GGUFWriter's padding
    direct = s.full_size or random_blocks
    writes = [((seed, index, t, qt, direct), str(path), offset)
              for index, ((t, qt), offset) in enumerate(zip(zip(plan, types), offsets))]
    written = 0
    for nbytes in _written_in_order(writes, jobs):
        written += nbytes
        if progress is not None:
            progress(nbytes)
    return written


Draw = tuple[int, int, PlannedTensor, QT, bool]  # seed, index, tensor, its type, drawn as random blocks


def _draw_one(draw: Draw) -> np.ndarray:
    seed, index, t, qt, direct = draw
    return _draw(np.random.default_rng([seed, index]), t, qt, direct)


_WRITE_BYTES = 1 << 30  # per pwrite call (Linux writes at most about 2 GiB at once)


def _draw_and_write(job: tuple[Draw, str, int]) -> int:
    """Draw one tensor and write it at `offset` of the file; its byte count."""
    draw, path, offset = job
    data = np.ascontiguousarray(_draw_one(draw))
    view = memoryview(data.reshape(-1).view(np.uint8))
    fd = os.open(path, os.O_WRONLY)
    try:
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done : done + _WRITE_BYTES], offset + done)
    finally:
        os.close(fd)
    return len(view)


def _written_in_order(writes: list[tuple[Draw, str, int]], jobs: int) -> Iterator[int]:
    """Each tensor drawn and written, its byte count yielded in file order; with jobs > 1, in worker processes."""
    if jobs <= 1:
        yield from map(_draw_and_write, writes)
        return
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        yield from pool.imap(_draw_and_write, writes)


def _draw(rng: np.random.Generator, t: PlannedTensor, qt: QT, direct: bool) -> np.ndarray:
    if qt == QT.F32 or not direct:
        values = float_values(rng, t)
        if qt == QT.F32:
            return values
        if qt == QT.F16:
            return values.astype(np.float16)
        return gguf.quants.quantize(values, qt)
    return random_tensor(rng, qt, t.shape, t.std)


def _stored_dtype(qt: QT) -> np.dtype:
    return np.dtype({QT.F32: np.float32, QT.F16: np.float16}.get(qt, np.uint8))


def _stored_shape(shape: tuple[int, ...], qt: QT) -> tuple[int, ...]:
    if qt in (QT.F32, QT.F16):
        return shape
    return gguf.quants.quant_shape_to_byte_shape(shape, qt)


def stored_nbytes(shape: tuple[int, ...], qt: QT) -> int:
    block, type_size = gguf.GGML_QUANT_SIZES[qt]
    if shape[-1] % block:
        raise SynthError(f"row length {shape[-1]} is not a multiple of {qt.name}'s block size {block}")
    return math.prod(shape) // block * type_size
