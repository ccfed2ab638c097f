"""MTP verification: the main model checks a draft in one batch, and the output stays what plain decoding gives.

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

from runner.engine.generation import penalised
from runner.engine.sampling import NON_FINITE, NonFiniteLogits, Sampler
from runner.spec.depth import DepthPolicy
from runner.spec.drafter import MTPDrafter
from runner.spec.stats import MAX_DRAFT_DEPTH, DraftStats


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


@dataclass(frozen=True)
class VerifyStep:
    drafts: list[int]  # what the drafter proposed after the pending token
    # the main model's logits after the pending token and after each draft [depth + 1, vocab]; None where the backend
    # chose each row's token (greedy_verify_step)
    rows: np.ndarray | None
    n_accepted: int  # drafts kept: the first n_accepted of `drafts`
    next_token: int  # the token after the kept run, from the main model's row n_accepted
    caught_up: int  # trunk rows the drafter fed its block before drafting
    draft_s: float
    verify_s: float
    verify_timed: bool  # False: a graph's warm-up or capture, whose time is not the batch's cost
    draft_timed: bool  # False: a draft step warmed up or captured a graph, likewise


def verify_step(engine: Any, drafter: MTPDrafter, token: int, depth: int,
                pick: Callable[[np.ndarray, list[int]], tuple[int, np.ndarray]],
                target: Callable[[np.ndarray, list[int]], np.ndarray], rng: np.random.Generator) -> VerifyStep:
    """One MTP step: draft `depth` tokens after the pending `token`, run [token, *drafts] through the main
    model as one batch, keep the longest acceptable run and the token after it, and cut both caches back.

    `pick(logits, drafts so far)` chooses a draft and the distribution it came from; `target(row, drafts
    so far)` is the distribution plain decoding would sample from after them.
    """
    def accept(drafts: list[int], q_rows: list[np.ndarray], rows: np.ndarray) -> tuple[int, int]:
        return accept_drafts(drafts, q_rows, lambda i: target(rows[i], drafts[:i]), rng)

    return _step(engine, drafter, token, depth, pick, engine.verify, accept, keep_rows=True)


def greedy_verify_step(engine: Any, drafter: MTPDrafter, token: int, depth: int) -> VerifyStep:
    """verify_step for a plain greedy request (generation.is_plain_greedy), every choice the backend's argmax: each
    draft (Ops.greedy_token of the block's row) and each verify row's token (engine.verify_greedy), so no row comes
    to the host. Drafts are kept while each is its row's argmax, as one-hot acceptance keeps them: the same
    tokens. A non-finite row ends the drafts there; one the kept run reaches raises NonFiniteLogits, as plain
    greedy decoding does at that token."""
    def pick(logits: Any, _drafts: list[int]) -> tuple[int | None, None]:
        return engine.ops.greedy_token(logits[-1]), None

    def accept(drafts: list[int], _q_rows: list[Any], chosen: list[int | None]) -> tuple[int, int]:
        n_accepted = next((i for i, d in enumerate(drafts) if chosen[i] != d), len(drafts))
        if chosen[n_accepted] is None:
            raise NonFiniteLogits(NON_FINITE)
        return n_accepted, chosen[n_accepted]

    return _step(engine, drafter, token, depth, pick, engine.verify_greedy, accept, keep_rows=False)


def _step(engine: Any, drafter: MTPDrafter, token: int, depth: int, pick: Callable[[Any, list[int]], tuple[Any, Any]],
          verify: Callable[[list[int]], tuple[Any, Any]], accept: Callable[[list[int], list[Any], Any], tuple[int, int]],
          keep_rows: bool) -> VerifyStep:
    """Both steps' frame: the drafts by `pick`, one verify batch by `verify` ((its rows, or the backend's choices),
    hidden), the kept run by `accept`, then both caches cut back to it; `keep_rows`: the step's rows are logits."""
    t0 = time.perf_counter()
    drafts, q_rows, caught_up = drafter.draft(token, depth, pick)
    t1 = time.perf_counter()
    n_cached = len(engine.kv_tokens)
    verify_timed = not engine.ops.graph_warming(engine.kv, 1 + len(drafts))  # a capture's time is not the batch's
    rows, hidden = verify([token, *drafts])  # one batch of depth + 1 rows
    t2 = time.perf_counter()
    n_accepted, next_token = accept(drafts, q_rows, rows)
    engine.rollback(n_cached + n_accepted + 1)  # keep the pending token and the accepted drafts
    drafter.commit(n_cached, hidden, n_accepted + 1, engine.kv_tokens)
    return VerifyStep(drafts, rows if keep_rows else None, n_accepted, next_token, caught_up, t1 - t0, t2 - t1,
                      verify_timed, drafter.draft_timed)


def speculative_tokens(engine: Any, drafter: MTPDrafter, policy: DepthPolicy, stats: list[DraftStats],
                       logits: np.ndarray, sampler: Sampler, counts: dict[int, int],
                       room: Callable[[], int], greedy: bool = False) -> Iterator[tuple[int, np.ndarray | None]]:
    """Tokens and the logits each was chosen from, one verify step at a time (the generation loop's source).

    `counts` are the generated-token counts the consumer keeps (penalties), `room()` how many tokens it
    still takes; `engine` gives verify(tokens) -> (host logits, hidden), verify_greedy, rollback(n) and kv_tokens.
    `greedy` (a plain greedy request only): the backend chooses every token (greedy_verify_step), and the tokens
    after the first come without their logits (None).
    """
    params = sampler.params

    def target(row: np.ndarray, prefix: list[int]) -> np.ndarray:
        """The distribution plain decoding would sample from after `prefix` (drafts) was generated too."""
        seen = dict(counts)
        for t in prefix:
            seen[t] = seen.get(t, 0) + 1
        row = penalised(row, seen, params)
        # Under a grammar both are masked after the drafts: a draft it forbids has p = 0 and is rejected.
        if params.greedy:
            return one_hot(len(row), int(np.argmax(sampler.constrained(row, prefix))))
        return sampler.probabilities(row, prefix)

    def pick(logits: Any, prefix: list[int]) -> tuple[int, np.ndarray]:
        q = target(np.asarray(engine.ops.to_host(logits))[-1], prefix)  # the drafter's: the same chain over its row
        return (int(np.argmax(q)) if params.greedy else int(sampler.rng.choice(len(q), p=q))), q

    token = sampler(penalised(logits, counts, params))
    sampler.accept(token)
    yield token, logits
    while True:
        depth = min(policy.next_depth(), room() - 1)  # never draft past max_tokens (nor the context)
        step = (greedy_verify_step(engine, drafter, token, depth) if greedy
                else verify_step(engine, drafter, token, depth, pick, target, sampler.rng))
        for s in stats:
            s.record(depth, step.n_accepted, step.draft_s, step.verify_s)
        # A whole prompt caught up is no draft step, nor is one that warmed up or captured a graph.
        representative = step.caught_up <= MAX_DRAFT_DEPTH + 1 and step.draft_timed
        policy.observe(depth, step.n_accepted, step.draft_s if representative else None,
                       step.verify_s if step.verify_timed else None)
        for i in range(step.n_accepted):
            sampler.accept(step.drafts[i])
            yield step.drafts[i], step.rows[i] if step.rows is not None else None
        token = step.next_token
        sampler.accept(token)
        yield token, step.rows[step.n_accepted] if step.rows is not None else None
