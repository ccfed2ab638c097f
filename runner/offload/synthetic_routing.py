"""Synthetic routing for benchmarks: the router still runs, but the MoE block gets the locality process's ids.

`--routing locality-<preset>` (locality_routing.PRESETS) builds a SyntheticRouting over the model's MoE
layers and context: a table of k expert ids per (layer, position), generated once from the process
calibrated for this shape; `--routing uniform` draws the table uniformly (the no-locality floor). The MoE block asks `ids_for` after `ops.route`: the router's top-k weights
are kept in their order, only the ids change, so compute is the same and which experts a token needs
follows the process. Ids are keyed by position, so a verify batch, a rollback and a later decode at
the same position see the same experts. Every record made under it carries `record()`.

The lookup works on numpy ids (from the table on the host) and on CuPy ids (from a copy of the table
uploaded once at the first CUDA lookup). Inside a CUDA graph the positions are the graph's device buffer
(int32 [rows]: 1 for decode, more for a verify batch) and the lookup is a device gather from that copy:
no host read, so one captured graph serves every position.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from runner.models.weights import MoEWeights
from runner.offload.locality_routing import PRESETS, RoutingError, calibrate
from runner.offload.provider import moe_layer_index

RANDOM, UNIFORM, LOCALITY = "random", "uniform", "locality-"


@dataclass(frozen=True)
class RoutingMode:
    """A run's routing: `random`, the file's router (a synthetic file's random router favours some experts:
    scripts/bench/demo_routing.py); `uniform`, k distinct experts drawn uniformly per position (no
    locality at all); `locality-PRESET`, the calibrated process of locality_routing.py."""

    label: str = RANDOM
    seed: int = 0

    @classmethod
    def parse(cls, flag: str, seed: int = 0) -> RoutingMode:
        locality = flag.startswith(LOCALITY) and flag.removeprefix(LOCALITY) in PRESETS
        if flag not in (RANDOM, UNIFORM) and not locality:
            choices = ", ".join([RANDOM, UNIFORM, *(LOCALITY + p for p in PRESETS)])
            raise RoutingError(f"unknown routing '{flag}'; choose from {choices}")
        return cls(flag, seed)

    @property
    def synthetic(self) -> bool:
        return self.label != RANDOM


def uniform_ids(n_expert: int, k: int, n_positions: int, n_layers: int, seed: int = 0) -> np.ndarray:
    """int32 [n_layers, n_positions, k]: k distinct experts per position drawn uniformly, independently."""
    rng = np.random.default_rng(seed)
    out = np.empty((n_layers, n_positions, k), dtype=np.int32)
    for p in range(n_positions):  # one position at a time: [L, P, E] floats would not fit a long context
        out[:, p] = np.argpartition(rng.random((n_layers, n_expert)), k - 1, axis=1)[:, :k]
    return out


class SyntheticRouting:
    def __init__(self, ids: np.ndarray, layers: Sequence[int], mode: RoutingMode, parameters: dict):
        """ids int32 [len(layers), n_positions, k]: layer layers[i]'s experts at each position."""
        self.layers = list(layers)
        self.mode = mode
        self.parameters = parameters
        self.n_positions, self.k = ids.shape[1], ids.shape[2]
        self._host = {layer: ids[i] for i, layer in enumerate(self.layers)}
        self._device: dict[int, Any] | None = None
        self.lookups = 0  # ids_for calls: 0 after a run means the forward never asked (see require_used)

    @classmethod
    def for_shape(cls, mode: RoutingMode, n_expert: int, k: int, layers: Iterable[int],
                  n_positions: int) -> SyntheticRouting:
        layers = sorted(set(layers))
        if mode.label == UNIFORM:
            ids = uniform_ids(n_expert, k, n_positions, len(layers), mode.seed)
            return cls(ids, layers, mode, {"n_expert": n_expert, "k": k, "seed": mode.seed})
        c = calibrate(mode.label.removeprefix(LOCALITY), n_expert, k, mode.seed)
        return cls(c.process.generate(n_expert, k, n_positions, len(layers)), layers, mode, c.to_dict())

    def ids_for(self, layer_index: int, ids: Any, positions_host: Sequence[int] | np.ndarray | None,
                device_position: Any = None) -> Any:
        """ids [T, k] (numpy or CuPy) replaced by the process's for `layer_index` at these positions: from
        `device_position` (a CuPy int32 [T], a decode or verify graph's) when given, else from `positions_host` [T]."""
        table = self._table(layer_index, ids)
        if device_position is not None:
            picked = table.take(device_position, axis=0)  # a device gather: safe inside a graph capture
        elif positions_host is None:
            raise RoutingError(f"layer {layer_index}: synthetic routing needs the positions of the rows; this "
                               f"forward gave none")
        else:
            positions = np.asarray(positions_host, dtype=np.int64)
            if positions.size and not (0 <= positions.min() and positions.max() < self.n_positions):
                raise RoutingError(f"positions {positions.min()}..{positions.max()} are outside the synthetic "
                                   f"routing table of {self.n_positions} positions")
            picked = table[positions] if isinstance(table, np.ndarray) else table.take(_cupy().asarray(positions), axis=0)
        if picked.shape != ids.shape:
            raise RoutingError(f"layer {layer_index}: the router gave ids {tuple(ids.shape)}, the synthetic table "
                               f"{tuple(picked.shape)} (top-{self.k})")
        self.lookups += 1
        return picked.astype(ids.dtype, copy=False)

    def _table(self, layer: int, ids: Any) -> Any:
        if layer not in self._host:
            raise RoutingError(f"layer {layer} has no synthetic routing table (MoE layers: {self.layers})")
        if isinstance(ids, np.ndarray):
            return self._host[layer]
        if self._device is None:  # attach() uploads on CUDA; this covers a routing built by hand
            self.upload()
        assert self._device is not None
        return self._device[layer]

    def upload(self) -> None:
        """The tables to the current CUDA device, every layer at once (table_bytes, outside the VRAM ledger);
        before any decode graph captures, since a capture cannot copy from the host."""
        cp = _cupy()
        self._device = {i: cp.asarray(t) for i, t in self._host.items()}

    @property
    def table_bytes(self) -> int:
        return sum(t.nbytes for t in self._host.values())

    def require_used(self) -> None:
        """Raise if no forward asked for ids: the model's MoE block does not call ids_for, so the run's
        figures are the router's, not this routing's."""
        if not self.lookups:
            raise RoutingError("synthetic routing was set but the forward never asked it for expert ids: the "
                               "model's MoE block has no routing hook (runner/models/transformer.py: moe_ffn)")

    def record(self) -> dict:
        """What a benchmark record says about this routing."""
        how = ("k distinct experts drawn uniformly per (layer, position): no locality" if self.mode.label == UNIFORM
               else "a seeded locality process (runner/offload/locality_routing.py)")
        return {"mode": self.mode.label, "synthetic": True,
                "note": f"SYNTHETIC ROUTING: the router ran, its expert ids were replaced by {how}; hit rates "
                        f"reflect that, not the model",
                "parameters": self.parameters, "table_positions": self.n_positions,
                "table_bytes": self.table_bytes, "layers": self.layers, "lookups": self.lookups}


def attach(engine: Any, mode: RoutingMode) -> SyntheticRouting | None:
    """The synthetic routing of `mode` for the engine's model and context, set on its trunk (None for random).

    Tables cover every MoE block (the NextN block's too, by its blk number) and the engine's context."""
    if not mode.synthetic:
        return None
    cfg = engine.model_config
    blocks = [*engine.model.weights.layers, *(n.weights.layer for n in engine.nextn)]
    layers = [moe_layer_index(lw.ffn) for lw in blocks if isinstance(lw.ffn, MoEWeights)]
    routing = SyntheticRouting.for_shape(mode, cfg.n_expert, cfg.n_expert_used, layers, engine.n_ctx)
    if getattr(engine.ops, "name", None) == "cuda":
        routing.upload()
    engine.model.routing = routing  # read by the MoE block (MoETransformer.ffn) at every forward
    return routing


def random_routing_record() -> dict:
    return {"mode": RANDOM, "synthetic": False,
            "note": "the file's router chose the experts (random weights route near-uniformly: LRU hit rate ~ "
                    "slots / n_expert)"}


def _cupy() -> Any:
    import cupy

    return cupy
