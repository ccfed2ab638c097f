"""What one forward pass runs under, handed down explicitly to the ops that depend on it.

A step says where routed experts come from (the engine's expert offload, a prefill stream, a test's
recorder; None: the backend's own resident copies) and, while a CUDA decode or verify graph warms up
or is captured, which device buffers hold the batch's token ids and their positions (so the recorded
kernels read them there and one graph serves every position). Nothing is set on the ops object from
outside.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from runner.backends.limits import SMALL_BATCH_ROWS


class GraphInputs(Protocol):
    """A decode graph's device inputs for its batch of `rows` tokens: the token ids (int64 [rows]) and
    their positions (int32 [rows])."""

    rows: int
    token: Any
    position: Any


def check_graph_rows(rows: int) -> int:
    """A graph's row count: 1 (decode) up to SMALL_BATCH_ROWS (a verify batch the batch-invariant kernels
    serve, so a replayed row gives an eager row's bits)."""
    if not 1 <= rows <= SMALL_BATCH_ROWS:
        raise ValueError(f"a decode graph runs 1 to {SMALL_BATCH_ROWS} rows, not {rows}")
    return rows


@dataclass(frozen=True)
class Step:
    experts: Any = None  # an ExpertProvider (runner/offload/provider.py); None: every expert resident
    graph: GraphInputs | None = None  # the decode graph being warmed up or captured; None: eager


RESIDENT = Step()  # a forward with every expert resident and no graph: the default everywhere
