"""Single-sequence KV cache: one K and one V buffer per layer, truncatable for rollback and prefix reuse.

Attention K/V satisfies the SequenceCache contract (sequence_cache.py) by truncation alone: every
position is reachable, and a checkpoint costs nothing. The buffers hold the backend's K/V type
(`ops.kv_type`: float16 by default, as llama.cpp stores it; backends/kv_type.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runner.backends.kv_type import DEFAULT_KV_TYPE, kv_dtype
from runner.engine.saved_state import SavedState, host_copy, upload_rows
from runner.errors import GenerationError


class KVCache:
    """Keys and values for positions 0..n_tokens-1 of one sequence, [n_ctx, n_head_kv, head_dim] per layer."""

    def __init__(self, ops: Any, n_layers: int, n_ctx: int, n_head_kv: int, head_dim: int):
        self.ops = ops
        self.n_ctx = n_ctx
        self.n_tokens = 0
        # A stand-in ops without a kv_type (a test's, holding no layers) gets the default.
        self.dtype = kv_dtype(getattr(ops, "kv_type", DEFAULT_KV_TYPE))
        self.k = [ops.zeros((n_ctx, n_head_kv, head_dim), self.dtype) for _ in range(n_layers)]
        self.v = [ops.zeros((n_ctx, n_head_kv, head_dim), self.dtype) for _ in range(n_layers)]

    def positions(self, n_new: int) -> np.ndarray:
        if self.n_tokens + n_new > self.n_ctx:
            raise GenerationError(
                f"context full: {self.n_tokens} cached + {n_new} new tokens exceed n_ctx {self.n_ctx}"
            )
        return np.arange(self.n_tokens, self.n_tokens + n_new)

    def store(self, layer: int, positions: np.ndarray, k: Any, v: Any, step: Any) -> tuple[Any, Any]:
        """Write this batch's K/V (float32, rounded to the cache's type) at its positions; return every
        cached K/V up to the batch's end, in the cache's type."""
        return self.ops.kv_store(self.k[layer], self.v[layer], positions, k, v, step)

    def store_roped(self, layer: int, positions: np.ndarray, q: Any, k: Any, v: Any, n_rot: int, base: float,
                    step: Any) -> tuple[Any, Any, Any]:
        """NEOX rotary on q and k, then store()'s write: (q rotated, every cached K, V up to the batch's end)."""
        return self.ops.rope_kv_store(q, k, v, self.k[layer], self.v[layer], positions, n_rot, base, step)

    def advance(self, n_new: int) -> None:
        self.n_tokens += n_new

    def checkpoint(self) -> None:
        pass  # any position can be forgotten later: nothing to save

    def reachable(self, n_tokens: int) -> int:
        return min(n_tokens, self.n_tokens)

    def rollback(self, n_tokens: int) -> None:
        self.truncate(n_tokens)

    def truncate(self, n_tokens: int) -> None:
        """Forget positions from n_tokens on (speculative rollback, reuse of a shared prompt prefix)."""
        if not 0 <= n_tokens <= self.n_tokens:
            raise ValueError(f"cannot truncate a cache of {self.n_tokens} tokens to {n_tokens}")
        self.n_tokens = n_tokens

    # -- host copies (the prompt cache) ------------------------------------------------------------
    def saved_bytes(self) -> int:
        return 2 * sum(int(buf[: self.n_tokens].nbytes) for buf in self.k)

    def save(self) -> SavedState:
        n = self.n_tokens
        return SavedState(n, tuple(host_copy(self.ops, b[:n]) for b in self.k),
                          tuple(host_copy(self.ops, b[:n]) for b in self.v))

    def load(self, saved: SavedState, n_tokens: int) -> None:
        if not 0 <= n_tokens <= saved.n_tokens or len(saved.k) != len(self.k):
            raise ValueError(f"cannot load {n_tokens} positions of a saved state of {saved.n_tokens} "
                             f"({len(saved.k)} layers) into a cache of {len(self.k)} layers")
        if any(rows.dtype != self.dtype for rows in (*saved.k, *saved.v)):
            raise ValueError(f"cannot load K/V saved as {saved.k[0].dtype} into a {self.dtype} cache")
        for buf, rows in zip((*self.k, *self.v), (*saved.k, *saved.v)):
            upload_rows(self.ops, buf, rows[:n_tokens])
        self.n_tokens = n_tokens
