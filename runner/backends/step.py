"""What one forward pass runs under, handed down explicitly to the ops that depend on it.

A step says where routed experts come from (the engine's expert offload, a prefill stream, a test's
recorder; None: the backend's own resident copies) and, while a CUDA decode graph warms up or is
captured, which device buffers hold the token and its position (so the recorded kernels read them
there and one graph serves every position). Nothing is set on the ops object from outside.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class GraphInputs(Protocol):
    """A decode graph's device inputs: the token id (int64 [1]) and its position (int32 [1])."""

    token: Any
    position: Any


@dataclass(frozen=True)
class Step:
    experts: Any = None  # an ExpertProvider (runner/offload/provider.py); None: every expert resident
    graph: GraphInputs | None = None  # the decode graph being warmed up or captured; None: eager


RESIDENT = Step()  # a forward with every expert resident and no graph: the default everywhere
