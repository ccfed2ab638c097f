"""The NextN (MTP) block as the decode graph classes see a model, so a draft step of 1..SMALL_BATCH_ROWS rows
replays from DecodeGraph (resident) or SegmentedDecodeGraph (expert offload) like a verify batch.

The graphs run `model.forward(tokens, kv, all_logits=, step=)` with token ids and positions in device
buffers; the block also takes hidden rows, so this adapter holds a third buffer, [rows, n_embd], that its
forward reads instead of an argument. `load` fills it before each step on the graph's stream, after the
work already queued on the caller's stream (which wrote the rows), and never inside a capture. The
segmented graph also reads `cfg.n_expert_used` and `weights.layers` (one table per MoE layer, keyed by its
blk number: the block's layer is blk.n_layer, which the expert provider serves beside the trunk's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from runner.backends.step import RESIDENT, Step, check_graph_rows
from runner.engine.kv_cache import KVCache
from runner.models.weights import LayerWeights


def _cupy() -> Any:
    import cupy

    return cupy


@dataclass(frozen=True)
class BlockLayers:
    """What SegmentedDecodeGraph reads of a model's weights: its decoder layers (the block's one)."""

    layers: tuple[LayerWeights, ...]


class NextNGraphModel:
    """`block` (a NextNBlock) with its hidden input in a device buffer of `rows` rows."""

    def __init__(self, block: Any, rows: int):
        cp = _cupy()
        self.block = block
        self.rows = check_graph_rows(rows)
        self.cfg = block.cfg
        self.weights = BlockLayers((block.weights.layer,))
        self.hidden = cp.zeros((rows, block.cfg.n_embd), dtype=cp.float32)

    def forward(self, tokens: np.ndarray, kv: KVCache, all_logits: bool = False,
                step: Step = RESIDENT) -> tuple[Any, Any]:
        """block.forward over the buffer's rows: logits [rows, vocab] (the block's head runs on every row,
        whatever `all_logits` says) and hidden [rows, n_embd]."""
        return self.block.forward(self.hidden, tokens, kv, step)

    def load(self, hidden: Any, stream: Any) -> None:
        """Copy hidden [rows, n_embd] (device) into the buffer on `stream`, ordered after the work queued on
        the current stream; the graph's step then sets its token and position buffers and launches."""
        if tuple(hidden.shape) != tuple(self.hidden.shape):
            raise ValueError(f"a draft graph of {self.hidden.shape} hidden rows got {tuple(hidden.shape)}")
        cp = _cupy()
        # The graph's stream is non-blocking: it would not wait for the null stream's writes of `hidden`.
        stream.wait_event(cp.cuda.get_current_stream().record())
        with stream:
            cp.copyto(self.hidden, hidden)
