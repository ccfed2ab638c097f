"""Host copies of a sequence cache's state (SequenceCache.save / load), which the prompt cache keeps in RAM.

Copies go through the backend's own `to_host` and `from_host`, nothing else, so one code path serves
numpy and CUDA: a save is one device-to-host copy per buffer; a load uploads K/V rows in bounded chunks
into the cache's existing buffers (their addresses, which decode graphs captured, do not change).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

UPLOAD_CHUNK_BYTES = 16 << 20  # a load's device temporaries stay this small whatever the context


@dataclass(frozen=True)
class SavedState:
    """Positions 0..n_tokens-1 of one sequence cache, on the host."""

    n_tokens: int
    k: tuple[np.ndarray, ...]  # per attention layer: [n_tokens, n_head_kv, head_dim]
    v: tuple[np.ndarray, ...]
    # Recurrent layers' state arrays (in the cache's own order) at each position a load may return to;
    # None: the cache has none (attention only), so every position is.
    recurrent: Mapping[int, tuple[np.ndarray, ...]] | None = None

    def reachable(self, n_tokens: int) -> int:
        """The longest prefix of at most n_tokens positions a load can return to (0 always)."""
        n_tokens = min(n_tokens, self.n_tokens)
        if self.recurrent is None:
            return n_tokens
        return max(p for p in (0, *self.recurrent) if p <= n_tokens)

    def covers(self, other: "SavedState") -> bool:
        """Whether every position `other` can return to is one this can (its tokens assumed a prefix of ours)."""
        if other.n_tokens > self.n_tokens:
            return False
        if self.recurrent is None:
            return True
        return set(other.recurrent or ()) <= set(self.recurrent)

    @property
    def nbytes(self) -> int:
        points = self.recurrent.values() if self.recurrent is not None else ()
        return sum(a.nbytes for a in (*self.k, *self.v)) + sum(a.nbytes for arrays in points for a in arrays)


def host_copy(ops: Any, x: Any) -> np.ndarray:
    """x's values on the host, safe from later forwards: numpy's to_host of a K/V slice is a view of the live
    buffer, so it is copied; an array that owns its memory (CuPy's download, or a DeltaNet state, which no op
    writes in place) is kept as it is."""
    host = ops.to_host(x)
    return host if host.flags.owndata else host.copy()


def upload_rows(ops: Any, buf: Any, rows: np.ndarray) -> None:
    """buf[:len(rows)] = rows, through device temporaries of at most UPLOAD_CHUNK_BYTES."""
    step = max(1, UPLOAD_CHUNK_BYTES // max(rows[:1].nbytes, 1))
    for start in range(0, len(rows), step):
        end = min(start + step, len(rows))
        buf[start:end] = ops.from_host(rows[start:end])
