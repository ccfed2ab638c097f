"""The device inputs of a decode or verify graph: its batch's token ids and their positions.

Both graph kinds (decode_graph.py, decode_segments.py) read them from these buffers, written from the
host before each step, so one captured graph serves every position (see decode_graph.py).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from runner.backends.step import check_graph_rows


class GraphBatch:
    """Token ids (int64 [rows]) and positions (int32 [rows]) on the device, staged on the host.

    The staging alternates between two host slots, so a step's uploads may still be queued behind the step
    before it (a greedy chain runs one ahead: backends/cuda/greedy_chain.py) while the next step's are written;
    `host_zeros` allocates them (pinned on CUDA, so the uploads are truly asynchronous)."""

    def __init__(self, cp: Any, rows: int, host_zeros: Callable[..., np.ndarray] = np.zeros):
        """`cp` is CuPy (a stand-in in CPU tests); call inside the graph's stream context."""
        self.rows = check_graph_rows(rows)
        self.token = cp.zeros(rows, dtype=cp.int64)
        self.position = cp.zeros(rows, dtype=cp.int32)
        self._host_token = host_zeros((2, rows), dtype=np.int64)
        self._host_position = host_zeros((2, rows), dtype=np.int32)
        self._slot = 0

    def load(self, tokens: Sequence[int], kv: Any, stream: Any) -> None:
        """`tokens` at the cache's next positions into the buffers, ordered on `stream`."""
        if len(tokens) != self.rows:
            raise ValueError(f"a graph of {self.rows} rows got {len(tokens)} tokens")
        self._host_token[self._slot] = tokens
        self.token.set(self._host_token[self._slot], stream=stream)
        self.load_positions(kv, stream)

    def load_positions(self, kv: Any, stream: Any) -> None:
        """The cache's next positions into the position buffer, ordered on `stream`; the token ids stay (a greedy
        chain's step reads those the step before it chose there). Ends the step's use of its staging slot."""
        kv.positions(self.rows)  # the capacity check, on the host as usual
        self._host_position[self._slot] = np.arange(kv.n_tokens, kv.n_tokens + self.rows)
        self.position.set(self._host_position[self._slot], stream=stream)
        self._slot ^= 1
