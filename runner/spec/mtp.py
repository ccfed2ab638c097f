"""MTP drafting with the model's NextN block, verified by the main model in one batch, lossless.

One verify step: the pending token x (sampled, not yet in the main KV cache) goes through the NextN
block with the trunk's hidden state, which drafts d1; d1 and the block's own hidden draft d2, and so
on to the depth. The main model then runs [x, d1, .., dk] as one batch of k+1 rows, which gives
the logits after each of them; `accept_drafts` keeps the longest acceptable run and picks the token
after it, and both KV caches are cut back to what was kept. Because the numpy backend computes each
row of a small batch exactly as single-token decode does, greedy output equals plain decoding's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from runner.backends.step import RESIDENT, Step
from runner.engine.generation import penalised
from runner.engine.sampling import Sampler
from runner.engine.sequence_cache import SequenceCache
from runner.errors import GenerationError
from runner.models.config import ModelConfig
from runner.spec.depth import DepthPolicy
from runner.spec.stats import MAX_DRAFT_DEPTH, DraftStats

DRAFT_MODES = ("none", "mtp")


@dataclass(frozen=True)
class DraftConfig:
    mode: str = "none"  # "mtp": draft with the model's NextN block; "none": plain decoding
    depth: int = MAX_DRAFT_DEPTH  # drafts per verify step (the most, when adaptive)
    adaptive: bool = True  # lower (and raise again) the depth from measured costs and acceptance

    def __post_init__(self) -> None:
        if self.mode not in DRAFT_MODES:
            raise GenerationError(f"unknown draft mode '{self.mode}'; choose from {', '.join(DRAFT_MODES)}")
        if not 1 <= self.depth <= MAX_DRAFT_DEPTH:
            raise GenerationError(f"--draft-depth must be in 1..{MAX_DRAFT_DEPTH}, got {self.depth}")

    @property
    def enabled(self) -> bool:
        return self.mode == "mtp"


def check_draft_support(cfg: ModelConfig, draft: DraftConfig) -> None:
    """`mtp` needs a NextN block in the file: say so at start-up rather than fall back to plain decoding."""
    if draft.enabled and cfg.n_nextn < 1:
        raise GenerationError(f"--draft mtp needs a NextN (MTP) block and this {cfg.arch} model has none; "
                              f"use --draft none")


def accept_drafts(drafts: Sequence[int], q_rows: Sequence[np.ndarray], p_row: Callable[[int], np.ndarray],
                  rng: np.random.Generator) -> tuple[int, int]:
    """Speculative acceptance (Leviathan et al. 2023, as gpt-fast's speculative_decode): (accepted, next token).

    drafts[i] was drawn from q_rows[i]; p_row(i) is the main model's distribution after x, d1..di
    (row i of the verify batch). The output is distributed exactly as sampling from p alone. Greedy
    callers pass one-hot rows, which turns this into "accept while the draft is the argmax".
    """
    for i, (token, q) in enumerate(zip(drafts, q_rows)):
        p = p_row(i)
        # Accept with probability min(1, p/q): q[token] <= p[token] always accepts (u < 1).
        if rng.random() * q[token] < p[token]:
            continue
        # Rejected: draw from the mass p has and q lacks, normalised max(0, p - q).
        residual = np.maximum(p - q, 0.0)
        total = residual.sum()
        return i, _draw(residual / total if total > 0 else p, rng)
    return len(drafts), _draw(p_row(len(drafts)), rng)  # all accepted: one more token from the last row


def _draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    top = int(np.argmax(probs))
    return top if probs[top] == 1.0 else int(rng.choice(len(probs), p=probs))  # one-hot: no draw needed


def one_hot(n: int, token: int) -> np.ndarray:
    out = np.zeros(n)
    out[token] = 1.0
    return out


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
              pick: Callable[[np.ndarray, list[int]], tuple[int, np.ndarray]]) -> tuple[list[int], list[np.ndarray], int]:
        """Draft `depth` tokens after `token`; the drafts, the distributions they came from and the rows caught up.

        The pending trunk rows go through the block first (the last one with `token`), so its cache
        covers the whole context; `pick(logits, drafts so far)` chooses each draft.
        """
        if depth == 0:
            return [], [], 0
        assert self.n_pending and self.next_position == len(self.tokens), "trunk rows must reach the last cached token"
        self.tokens.append(token)
        caught_up = self.n_pending
        logits, hidden = self._feed(self.n_pending, self.ubatch)
        trunk_entries = self.kv.n_tokens
        self.kv.checkpoint()  # the drafts' own entries are dropped below
        drafts, dists = [], []
        for step in range(depth):
            if step:  # recursion: the block's own hidden state and its draft feed the next step
                logits, hidden = self.block.forward(hidden[-1:], np.asarray([drafts[-1]]), self.kv, self.step)
            d, q = pick(np.asarray(self.block.ops.to_host(logits[-1:]))[-1], drafts)
            drafts.append(d)
            dists.append(q)
        self.kv.rollback(trunk_entries)
        del self.tokens[-1]
        return drafts, dists, caught_up

    def catch_up(self, rows_per_batch: int) -> int:
        """Feed the block every pending trunk row whose next token is known (all but the last
        position's, which waits for the sampled token), in batches of `rows_per_batch`; the rows fed.

        A streamed prompt calls this inside the prefill phase, where the block's experts are staged
        like a layer's, so the first draft catches up one row instead of the whole prompt.
        """
        n = max(0, min(self.n_pending, len(self.tokens) - 1 - self.kv.n_tokens))
        if n:
            self._feed(n, rows_per_batch)
        return n

    def _feed(self, n: int, rows_per_batch: int) -> tuple[Any, Any]:
        """The first n pending rows through the block (entry j: trunk hidden j, token j+1); its last output."""
        logits = hidden = None
        position, left, kept = self.kv.n_tokens, n, []
        for chunk in self.pending:
            take = min(left, len(chunk))
            for a in range(0, take, rows_per_batch):
                rows = chunk[a : min(a + rows_per_batch, take)]
                ids = np.asarray(self.tokens[position + 1 : position + 1 + len(rows)])
                logits, hidden = self.block.forward(rows, ids, self.kv, self.step)
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

    def _keep_rows(self, n: int) -> None:
        kept, total = [], 0
        for chunk in self.pending:
            if total >= n:
                break
            kept.append(chunk[: n - total])
            total += len(kept[-1])
        self.pending, self.n_pending = kept, total


def speculative_tokens(engine: Any, drafter: MTPDrafter, policy: DepthPolicy, stats: list[DraftStats],
                       logits: np.ndarray, sampler: Sampler, counts: dict[int, int],
                       room: Callable[[], int]) -> Iterator[tuple[int, np.ndarray]]:
    """Tokens and the logits each was chosen from, one verify step at a time (the generation loop's source).

    `counts` are the generated-token counts the consumer keeps (penalties), `room()` how many tokens it
    still takes; `engine` gives verify(tokens) -> (host logits, hidden), rollback(n) and kv_tokens.
    """
    params = sampler.params

    def target(row: np.ndarray, prefix: list[int]) -> np.ndarray:
        """The distribution plain decoding would sample from after `prefix` (drafts) was generated too."""
        seen = dict(counts)
        for t in prefix:
            seen[t] = seen.get(t, 0) + 1
        row = penalised(row, seen, params)
        return one_hot(len(row), int(np.argmax(row))) if params.greedy else sampler.probabilities(row)

    def pick(row: np.ndarray, prefix: list[int]) -> tuple[int, np.ndarray]:
        q = target(row, prefix)  # the drafter's distribution: the same chain over the block's logits
        return (int(np.argmax(q)) if params.greedy else int(sampler.rng.choice(len(q), p=q))), q

    token = sampler(penalised(logits, counts, params))
    yield token, logits
    while True:
        depth = min(policy.next_depth(), room() - 1)  # never draft past max_tokens (nor the context)
        t0 = time.perf_counter()
        drafts, q_rows, caught_up = drafter.draft(token, depth, pick)
        t1 = time.perf_counter()
        n_cached = len(engine.kv_tokens)
        rows, hidden = engine.verify([token, *drafts])  # one batch of depth+1 rows
        t2 = time.perf_counter()
        n_accepted, token_next = accept_drafts(drafts, q_rows, lambda i: target(rows[i], drafts[:i]), sampler.rng)
        engine.rollback(n_cached + n_accepted + 1)  # keep x and the accepted drafts
        drafter.commit(n_cached, hidden, n_accepted + 1, engine.kv_tokens)
        for s in stats:
            s.record(depth, n_accepted, t1 - t0, t2 - t1)
        representative = caught_up <= MAX_DRAFT_DEPTH + 1  # a whole prompt caught up is no draft step
        policy.observe(depth, n_accepted, (t1 - t0) if representative else None, t2 - t1)
        for i in range(n_accepted):
            yield drafts[i], rows[i]
        token = token_next
        yield token, rows[n_accepted]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
