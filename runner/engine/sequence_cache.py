"""The per-sequence state a model keeps between forwards, and the rollback contract the engine relies on.

The engine moves a sequence back for three reasons: a new prompt that shares only a prefix with the
cached one, drafts the verify batch rejected, and a reset. Attention K/V can simply forget positions
(truncate). State that cannot be truncated (a recurrent layer's, such as Gated DeltaNet's) must have
saved what it needs to return to: the engine says when (`checkpoint`), and asks how far back it can go
(`reachable`) before it rolls back. A model whose layers keep several kinds of state gives the engine
one object that combines them under this contract, so a new layer type needs no change in the engine.

The prompt cache (prompt_cache.py) also keeps whole sequences in host RAM: `save` copies out what the
cache holds, and `load` puts a reachable prefix of such a copy back.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from runner.engine.saved_state import SavedState


class SequenceCache(Protocol):
    n_ctx: int
    n_tokens: int  # positions 0..n_tokens-1 are cached

    def positions(self, n_new: int) -> np.ndarray:
        """The positions of the next n_new tokens; a clear error when they exceed the context."""

    def advance(self, n_new: int) -> None:
        """The forward that wrote the next n_new positions is done."""

    def checkpoint(self) -> None:
        """From here on, rollback must be able to return to the current position and to every position
        the next forward (a verify batch, at most a few rows) writes, until the next checkpoint."""

    def reachable(self, n_tokens: int) -> int:
        """The longest prefix of at most n_tokens positions that rollback can return to."""

    def rollback(self, n_tokens: int) -> None:
        """Keep exactly the first n_tokens positions; n_tokens must be reachable."""

    def saved_bytes(self) -> int:
        """Host bytes `save()` would take now (the prompt cache checks its budget before copying)."""

    def save(self) -> SavedState:
        """Host copies of positions 0..n_tokens-1 and of any recurrent state at each position rollback can
        return to; the cache is unchanged."""

    def load(self, saved: SavedState, n_tokens: int) -> None:
        """Hold exactly the first n_tokens positions of `saved` (n_tokens reachable in it), copied to the device."""
