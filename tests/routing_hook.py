"""MoETransformer with the synthetic-routing hook (no tests here), for CPU tests until the hook lands in
runner/models/transformer.py: the feed-forward half of an MoE layer routes as moe_ffn does, then takes
its expert ids from `self.routing.ids_for(layer, ids, positions, device position)`, weights kept.

Positions reach `ffn` through the forward that runs it; a layer-major prompt runs chunk by chunk
(group_tokens 0), so each `ffn` call is one chunk's. Use with
`monkeypatch.setattr("runner.models.MoETransformer", HookedTransformer)` before the engine loads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from runner.backends.step import RESIDENT, Step
from runner.models.transformer import MoETransformer, dense_ffn
from runner.models.weights import MoEWeights


class HookedTransformer(MoETransformer):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.routing: Any = None
        self._positions: np.ndarray | None = None  # the rows of the forward running now
        self._chunks: Iterator[np.ndarray] | None = None  # or of a layer-major prompt's chunks, in order

    def forward(self, tokens: np.ndarray, kv: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        self._positions, self._chunks = kv.positions(len(tokens)), None
        return super().forward(tokens, kv, *args, **kwargs)

    def layer_over_chunks(self, i: int, xs: list[Any], positions: list[np.ndarray], kv: Any,
                          step: Step = RESIDENT, group_tokens: int = 0) -> list[Any]:
        self._chunks = iter(positions)
        return super().layer_over_chunks(i, xs, positions, kv, step, 0)

    def ffn(self, i: int, x: Any, step: Step) -> Any:
        lw = self.weights.layers[i]
        if self.routing is None or not isinstance(lw.ffn, MoEWeights):
            return super().ffn(i, x, step)
        positions = next(self._chunks) if self._chunks is not None else self._positions
        ops, cfg, w = self.ops, self.cfg, lw.ffn
        h = ops.rms_norm(x, lw.ffn_norm, cfg.rms_eps)
        ids, weights = ops.route(ops.linear(h, w.router), w.probs_bias, cfg)
        ids = self.routing.ids_for(i, ids, positions, step.graph.position if step.graph is not None else None)
        out = ops.moe(h, ids, weights, w, step)
        return out + dense_ffn(ops, w.shared, h) if w.shared is not None else out
