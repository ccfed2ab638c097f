"""The drafting side of MTP: the model's NextN block with its own KV cache, fed the trunk's hidden states.

Entry j of the block's cache is made from (the trunk's hidden state at j, token j+1). A prompt's
states catch up in batches (inside the prefill phase under expert offload), eagerly; a draft step feeds the
last pending states with the sampled token, then recurses on the block's own output to the depth, each
forward of up to 1 + the depth rows through ops.draft_forward (replayed from CUDA graphs there), longer ones eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from runner.backends.step import RESIDENT, Step
from runner.engine.saved_state import SavedState, host_copy
from runner.engine.sequence_cache import SequenceCache


@dataclass(frozen=True)
class SavedDrafter:
    """A drafter's state on the host, saved beside the trunk's by the prompt cache."""

    tokens: tuple[int, ...]
    kv: SavedState
    pending: tuple[np.ndarray, ...]  # the trunk hidden rows not yet fed to the block

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes + sum(r.nbytes for r in self.pending)


class MTPDrafter:
    """The NextN block's side of one sequence: its KV cache and the trunk hidden rows not yet fed to it.

    NextN entry j is made from (the trunk's hidden state at j, token j+1). `tokens` is the sequence
    the entries and the pending rows were computed from, so a new prompt keeps exactly what it shares.
    Between verify steps the cache holds only entries made from trunk states (those from the block's
    own states, made while drafting, are dropped at once).
    """

    def __init__(self, block: Any, n_ctx: int, ubatch: int, step: Step = RESIDENT):
        self.block = block
        self.step = step  # the engine's: the block's routed experts come from the same provider as the trunk's
        self.kv: SequenceCache = block.new_kv_cache(n_ctx)
        self.ubatch = ubatch
        self.tokens: list[int] = []
        self.pending: list[Any] = []  # chunks of trunk hidden rows, for positions kv.n_tokens onwards
        self.n_pending = 0
        self.draft_timed = True  # the last draft ran no graph's warm-up or capture: its time is its cost
        # Draft steps of up to this many rows replay graphs (1 + the depth: what a verify step can leave pending);
        # a probe's longer catch-up runs eagerly, so the card holds graphs of 1..graph_rows rows only.
        self.graph_rows = 1

    @property
    def next_position(self) -> int:
        """The first position whose trunk hidden state is neither in the NextN cache nor pending."""
        return self.kv.n_tokens + self.n_pending

    def prepare(self, prompt: list[int]) -> int:
        """Keep the entries and rows that `prompt` shares; the main cache must recompute from this position."""
        shared = _common_prefix(self.tokens, prompt)
        entries = self.kv.reachable(max(shared - 1, 0))  # entry j also needs token j+1
        if entries < self.kv.n_tokens:
            self.kv.rollback(entries)
            self._keep_rows(0)
        else:
            self._keep_rows(max(shared - entries, 0))  # the hidden state at j depends on tokens 0..j
        self.tokens = list(prompt)
        return self.next_position

    def add_hidden(self, start: int, hidden: Any) -> None:
        """Trunk hidden rows for positions start.. (a prefill chunk, a verify batch); rows already held are skipped."""
        skip = self.next_position - start
        if skip < 0:
            raise AssertionError(f"trunk hidden rows from {start} leave a gap after {self.next_position}")
        if skip < len(hidden):
            self.pending.append(hidden[skip:])
            self.n_pending += len(hidden) - skip

    def draft(self, token: int, depth: int,
              pick: Callable[[Any, list[int]], tuple[int | None, Any]]) -> tuple[list[int], list[np.ndarray], int]:
        """Draft up to `depth` tokens after `token`; the drafts, the distributions they came from and the rows
        caught up.

        The pending trunk rows go through the block first (the last one with `token`), so its cache
        covers the whole context; `pick(logits, drafts so far)` chooses each draft from the block's last row of
        logits as the backend holds it ([1, vocab]): (draft, its distribution), or a None draft (a row the
        device's argmax found non-finite), which ends the drafts there.
        """
        self.draft_timed = True
        if depth == 0:
            return [], [], 0
        assert self.n_pending and self.next_position == len(self.tokens), "trunk rows must reach the last cached token"
        self.tokens.append(token)
        caught_up = self.n_pending
        logits, hidden = self._feed(self.n_pending, self.ubatch, self._step_forward)
        trunk_entries = self.kv.n_tokens
        self.kv.checkpoint()  # the drafts' own entries are dropped below
        drafts, dists = [], []
        for step in range(depth):
            if step:  # recursion: the block's own hidden state and its draft feed the next step
                logits, hidden = self._step_forward(hidden[-1:], np.asarray([drafts[-1]]))
            d, q = pick(logits[-1:], drafts)
            if d is None:
                break
            drafts.append(d)
            dists.append(q)
        self.kv.rollback(trunk_entries)
        del self.tokens[-1]
        return drafts, dists, caught_up

    def catch_up(self, rows_per_batch: int) -> int:
        """Feed the block every pending trunk row whose next token is known (all but the last
        position's, which waits for the sampled token), in batches of `rows_per_batch`; the rows fed.

        A streamed prompt calls this inside the prefill phase, where the block's experts are staged
        like a layer's, so the first draft catches up one row instead of the whole prompt. Eager, even for
        a few rows: a graph's host steps fetch through the expert cache, which a streaming prompt holds.
        """
        n = max(0, min(self.n_pending, len(self.tokens) - 1 - self.kv.n_tokens))
        if n:
            self._feed(n, rows_per_batch, self._eager_forward)
        return n

    def _step_forward(self, hidden: Any, ids: np.ndarray) -> tuple[Any, Any]:
        """A draft step's forward: through ops.draft_forward (a graph's outputs, which its next step overwrites:
        nothing here keeps them past the next forward), eager past graph_rows rows."""
        if len(ids) > self.graph_rows:
            return self._eager_forward(hidden, ids)
        ops = self.block.ops
        if ops.graph_warming(self.kv, len(ids), draft=True):
            self.draft_timed = False
        return ops.draft_forward(self.block, hidden, ids, self.kv, self.step)

    def _eager_forward(self, hidden: Any, ids: np.ndarray) -> tuple[Any, Any]:
        return self.block.forward(hidden, ids, self.kv, self.step)

    def _feed(self, n: int, rows_per_batch: int,
              forward: Callable[[Any, np.ndarray], tuple[Any, Any]]) -> tuple[Any, Any]:
        """The first n pending rows through `forward` (entry j: trunk hidden j, token j+1); its last output."""
        logits = hidden = None
        position, left, kept = self.kv.n_tokens, n, []
        for chunk in self.pending:
            take = min(left, len(chunk))
            for a in range(0, take, rows_per_batch):
                rows = chunk[a : min(a + rows_per_batch, take)]
                ids = np.asarray(self.tokens[position + 1 : position + 1 + len(rows)])
                logits, hidden = forward(rows, ids)
                position += len(rows)
            left -= take
            if take < len(chunk):
                kept.append(chunk[take:])
        self.pending, self.n_pending = kept, self.n_pending - n
        return logits, hidden

    def commit(self, start: int, hidden: Any, n_kept: int, cached_tokens: list[int]) -> None:
        """After a verify step from position `start`: the trunk rows of the n_kept positions the main
        cache kept, and the tokens it now holds."""
        assert start == self.next_position, f"verify batch at {start}, trunk rows reach {self.next_position}"
        self.add_hidden(start, hidden[:n_kept])
        self.tokens = list(cached_tokens)

    def save(self) -> SavedDrafter:
        ops = self.block.ops
        return SavedDrafter(tuple(self.tokens), self.kv.save(), tuple(host_copy(ops, c) for c in self.pending))

    def restore(self, saved: SavedDrafter) -> None:
        """Become the drafter that `saved` was (prepare() then keeps what the next prompt shares)."""
        self.kv.load(saved.kv, saved.kv.n_tokens)
        self.tokens = list(saved.tokens)
        self.pending = [self.block.ops.from_host(r) for r in saved.pending]
        self.n_pending = sum(len(r) for r in saved.pending)

    def _keep_rows(self, n: int) -> None:
        kept, total = [], 0
        for chunk in self.pending:
            if total >= n:
                break
            kept.append(chunk[: n - total])
            total += len(kept[-1])
        self.pending, self.n_pending = kept, total


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
