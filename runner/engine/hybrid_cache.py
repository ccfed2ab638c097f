"""One sequence's state in a hybrid model: attention K/V for the full-attention layers, and each Gated
DeltaNet layer's conv and recurrent state, under the rollback contract of sequence_cache.py.

K/V can forget positions; recurrent state cannot, so the cache keeps snapshots of every DeltaNet layer's
state at the positions it may be asked to return to:
- at each `checkpoint()` (the end of a prompt, the start of a verify batch): the state there;
- through the one forward after a checkpoint, when it is small (a verify batch, at most
  SMALL_BATCH_ROWS rows): the state after each of its rows, so rejected drafts roll back without
  recomputation (the ops return the per-row states; llama.cpp keeps the same snapshots);
- position 0, the empty state, is always reachable;
- every `periodic.every_tokens` positions (at the end of the batch that reaches each multiple, or at the
  multiple itself in a batch that gives every row's state): periodic checkpoints, in host RAM, so a prompt
  that leaves a long one midway restarts from the nearest one before the point it leaves, not from 0
  (`periodic.keep` at most: past it every other one goes, the spacing doubles); they outlive checkpoints.
Row snapshots last until the next checkpoint; the most recent MAX_CHECKPOINTS checkpoints are kept.

State arrays are never written in place: each forward's ops return new ones (HybridOps), so a snapshot
holds references, and checkpoints and rollbacks copy nothing, but for the periodic checkpoints: copied to
the host (to_host) when taken and to the device (from_host) when a rollback returns to one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from runner.backends.limits import SMALL_BATCH_ROWS
from runner.engine.kv_cache import KVCache
from runner.engine.saved_state import SavedState, host_copy

if TYPE_CHECKING:  # runner.models imports this module
    from runner.models.config import ModelConfig

MAX_CHECKPOINTS = 4
# The most copies of the DeltaNet state alive at once, what sizing counts on the device: the states at
# n_tokens (kept while a forward runs, for discard), the states a forward makes (after each of its rows
# when it keeps them, the last one live) and the checkpoints.
DEVICE_STATE_SETS = 1 + SMALL_BATCH_ROWS + MAX_CHECKPOINTS


@dataclass(frozen=True)
class PeriodicCheckpoints:
    """Where a long prompt (or generation) leaves checkpoints of its DeltaNet state in host RAM."""

    every_tokens: int = 2048  # one where a batch reaches each multiple; 0: none
    keep: int = 8  # at most this many: past it, every other one goes (the spacing doubles)

    def __post_init__(self) -> None:
        if self.every_tokens < 0 or self.keep < 1:
            raise ValueError(f"periodic checkpoints every {self.every_tokens} tokens, keep {self.keep}: "
                             f"every_tokens must be >= 0 (0: none) and keep >= 1")

    def index(self, start: int, end: int, stride: int) -> int:
        """The multiple of every_tokens a batch over positions start..end-1 reaches last, among those
        kept at this stride (every stride-th multiple); 0: none."""
        if not self.every_tokens:
            return 0
        last = end // self.every_tokens // stride * stride
        return last if last > start // self.every_tokens else 0


PERIODIC_DEFAULT = PeriodicCheckpoints()


@dataclass(frozen=True)
class DeltaNetState:
    conv: Any  # [K-1, conv_dim]: the last K-1 inputs of the short conv, oldest first
    ssm: Any  # [H_v, S, S]: the recurrent state, [head, value, key]


@dataclass
class _Snapshot:
    states: tuple[DeltaNetState, ...]  # one per DeltaNet layer, in layer order
    from_checkpoint: bool  # False: a row of the forward after a checkpoint (dropped at the next one)
    periodic: int = 0  # a periodic checkpoint (host arrays): which multiple of every_tokens; 0: not one


class HybridCache:
    """SequenceCache of a hybrid model: `store` for attention layers, `recurrent`/`update` for DeltaNet layers."""

    def __init__(self, ops: Any, cfg: ModelConfig, n_ctx: int, n_layers: int | None = None,
                 periodic: PeriodicCheckpoints = PERIODIC_DEFAULT):
        dn = cfg.delta_net
        assert dn is not None
        self.ops = ops
        layers = range(cfg.n_layer if n_layers is None else n_layers)
        self._kv_slot = {i: n for n, i in enumerate(i for i in layers if not cfg.is_recurrent(i))}
        self._recurrent_slot = {i: n for n, i in enumerate(i for i in layers if cfg.is_recurrent(i))}
        self.kv = KVCache(ops, len(self._kv_slot), n_ctx, cfg.n_head_kv, cfg.head_dim)
        self._empty = tuple(DeltaNetState(ops.zeros((dn.conv_kernel - 1, dn.conv_dim)),
                                          ops.zeros((dn.n_v_heads, dn.head_dim, dn.head_dim)))
                            for _ in self._recurrent_slot)
        self.states = list(self._empty)
        self._advanced = tuple(self.states)  # the states at n_tokens, for a forward given up midway
        self.snapshots: dict[int, _Snapshot] = {}
        self._open_at: int | None = None  # a checkpoint's position while its next forward has not ended
        self._rows: dict[int, list[DeltaNetState]] = {}  # that forward's per-row states, by position
        self.periodic = periodic
        self._stride = 1  # periodic checkpoints kept at every stride-th multiple of every_tokens
        self._periodic_rows: dict[int, tuple[int, list[DeltaNetState]]] = {}  # this forward's, on the host

    # -- the forward's side ------------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return self.kv.n_ctx

    @property
    def n_tokens(self) -> int:
        return self.kv.n_tokens

    def positions(self, n_new: int) -> np.ndarray:
        return self.kv.positions(n_new)

    def store(self, layer: int, positions: np.ndarray, k: Any, v: Any, step: Any) -> tuple[Any, Any]:
        """Attention layer `layer` writes this batch's K/V; every cached K/V up to the batch's end."""
        return self.kv.store(self._kv_slot[layer], positions, k, v, step)

    def store_roped(self, layer: int, positions: np.ndarray, q: Any, k: Any, v: Any, n_rot: int, base: float,
                    step: Any) -> tuple[Any, Any, Any]:
        return self.kv.store_roped(self._kv_slot[layer], positions, q, k, v, n_rot, base, step)

    def recurrent(self, layer: int) -> DeltaNetState:
        return self.states[self._recurrent_slot[layer]]

    def keeps_rows(self, positions: np.ndarray) -> bool:
        """Whether a batch at `positions` must hand over the state after each of its rows: the first
        batch after a checkpoint, when small (a layer-major prompt's later chunks start further on)."""
        return self._open_at == self.n_tokens == int(positions[0]) and len(positions) <= SMALL_BATCH_ROWS

    def update(self, layer: int, positions: np.ndarray, window: Any, states: Any) -> None:
        """DeltaNet layer `layer` ran the batch at `positions`: its conv window [K-1+T, C] and its states,
        after every row [T, H_v, S, S] when keeps_rows said so, else after the last row [1, H_v, S, S]."""
        slot = self._recurrent_slot[layer]
        k_minus_1 = self._empty[slot].conv.shape[0]
        self.states[slot] = DeltaNetState(window[-k_minus_1:].copy(), states[-1])
        every_row = self.keeps_rows(positions)
        self._take_periodic(slot, positions, window, states, every_row)
        if every_row:
            assert len(states) == len(positions), "keeps_rows asked for every row's state"
            for row, position in enumerate(positions):
                conv = window[row + 1 : row + 1 + k_minus_1].copy()
                per_layer = self._rows.setdefault(int(position) + 1, [None] * len(self.states))
                per_layer[slot] = DeltaNetState(conv, states[row])

    def _take_periodic(self, slot: int, positions: np.ndarray, window: Any, states: Any, every_row: bool) -> None:
        """The layer's state where this batch reaches a multiple of every_tokens, to the host now (a
        layer-major prompt would otherwise hold one copy on the device per point until it advances): at
        the multiple itself when the batch gave every row's state (a verify batch: rejected drafts past
        it keep it), else at the batch's end."""
        start, end = int(positions[0]), int(positions[-1]) + 1
        stride = self._stride if any(s.periodic for s in self.snapshots.values()) else 1
        index = self.periodic.index(start, end, stride)
        if not index:
            return
        at = index * self.periodic.every_tokens if every_row else end
        row = at - start - 1
        conv = window[row + 1 : row + 1 + self._empty[slot].conv.shape[0]]
        host = DeltaNetState(host_copy(self.ops, conv), host_copy(self.ops, states[row if every_row else -1]))
        self._periodic_rows.setdefault(at, (index, [None] * len(self.states)))[1][slot] = host

    def advance(self, n_new: int) -> None:
        self.kv.advance(n_new)
        self._advanced = tuple(self.states)
        if self._open_at is not None:  # the forward after a checkpoint is over: keep its rows, stop recording
            for position, states in self._rows.items():
                self.snapshots[position] = _Snapshot(tuple(states), from_checkpoint=False)
            self._rows = {}
            self._open_at = None
        for position, (index, states) in self._periodic_rows.items():  # in place of a row snapshot there
            self.snapshots[position] = _Snapshot(tuple(states), from_checkpoint=True, periodic=index)
        self._periodic_rows = {}
        self._thin_periodic()

    def _thin_periodic(self) -> None:
        """At most periodic.keep periodic checkpoints: double the stride until they fit."""
        kept = {p: s.periodic for p, s in self.snapshots.items() if s.periodic}
        if not kept:
            self._stride = 1
        while len(kept) > self.periodic.keep:
            self._stride *= 2
            for position in [p for p, index in kept.items() if index % self._stride]:
                del self.snapshots[position], kept[position]

    def discard(self) -> None:
        """Forget a forward given up before it advanced (a cancelled layer-major prompt): the DeltaNet
        layers it already ran go back to their states at n_tokens (K/V past n_tokens is ignored anyway)."""
        self.states = list(self._advanced)
        self._rows = {}
        self._periodic_rows = {}

    # -- the rollback contract ---------------------------------------------------------------------
    def checkpoint(self) -> None:
        self.snapshots = {p: s for p, s in self.snapshots.items() if s.from_checkpoint}
        held = sorted(p for p, s in self.snapshots.items() if not s.periodic)  # periodic ones have their own bound
        for old in held[: max(len(held) - MAX_CHECKPOINTS + 1, 0)]:
            del self.snapshots[old]
        there = self.snapshots.get(self.n_tokens)
        if self.n_tokens and not (there and there.periodic):  # a periodic one there serves as this checkpoint
            self.snapshots[self.n_tokens] = _Snapshot(tuple(self.states), from_checkpoint=True)
        self._open_at = self.n_tokens
        self._rows = {}

    def reachable(self, n_tokens: int) -> int:
        limit = min(n_tokens, self.n_tokens)
        return max(p for p in (0, self.n_tokens, *self.snapshots) if p <= limit)

    def rollback(self, n_tokens: int) -> None:
        if n_tokens == self.n_tokens:
            return
        if n_tokens == 0:
            self.states = list(self._empty)
        elif n_tokens in self.snapshots:
            kept = self.snapshots[n_tokens]
            self.states = list(kept.states)
            if kept.periodic:  # host arrays: the device gets copies, the checkpoint stays on the host
                self.states = [DeltaNetState(self.ops.from_host(s.conv), self.ops.from_host(s.ssm))
                               for s in kept.states]
        else:
            raise ValueError(f"position {n_tokens} is not reachable (reachable: {self.reachable(n_tokens)})")
        self._advanced = tuple(self.states)
        self.kv.truncate(n_tokens)
        self.snapshots = {p: s for p, s in self.snapshots.items() if p <= n_tokens}
        self._open_at = None
        self._rows = {}
        self._periodic_rows = {}
        self._thin_periodic()

    # -- host copies (the prompt cache): K/V rows, and the states at the checkpoints and at the end ----
    def _save_points(self) -> dict[int, tuple[DeltaNetState, ...]]:
        points = {p: s.states for p, s in self.snapshots.items() if s.from_checkpoint and 0 < p <= self.n_tokens}
        if self.n_tokens:
            points[self.n_tokens] = tuple(self.states)
        return points

    def saved_bytes(self) -> int:
        per_point = sum(int(s.conv.nbytes) + int(s.ssm.nbytes) for s in self.states)
        return self.kv.saved_bytes() + per_point * len(self._save_points())

    def save(self) -> SavedState:
        points = {p: tuple(host_copy(self.ops, a) for s in states for a in (s.conv, s.ssm))
                  for p, states in self._save_points().items()}
        return replace(self.kv.save(), recurrent=points)

    def load(self, saved: SavedState, n_tokens: int) -> None:
        """K/V rows into the buffers; the DeltaNet states at n_tokens uploaded, kept as a checkpoint there."""
        if n_tokens and n_tokens not in (saved.recurrent or {}):
            raise ValueError(f"position {n_tokens} is not reachable in the saved state")
        self.kv.load(saved, n_tokens)
        if n_tokens:
            arrays = [self.ops.from_host(a) for a in saved.recurrent[n_tokens]]
            self.states = [DeltaNetState(c, s) for c, s in zip(arrays[::2], arrays[1::2])]
        else:
            self.states = list(self._empty)
        self._advanced = tuple(self.states)
        self.snapshots = {n_tokens: _Snapshot(tuple(self.states), from_checkpoint=True)} if n_tokens else {}
        self._open_at = None
        self._rows = {}
