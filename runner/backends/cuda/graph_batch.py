"""The device inputs of a decode or verify graph: its batch's token ids and their positions.

Both graph kinds (decode_graph.py, decode_segments.py) read them from these buffers, written from the
host before each step, so one captured graph serves every position (see decode_graph.py).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from runner.backends.step import check_graph_rows


class GraphBatch:
    """Token ids (int64 [rows]) and positions (int32 [rows]) on the device, staged on the host."""

    def __init__(self, cp: Any, rows: int):
        """`cp` is CuPy (a stand-in in CPU tests); call inside the graph's stream context."""
        self.rows = check_graph_rows(rows)
        self.token = cp.zeros(rows, dtype=cp.int64)
        self.position = cp.zeros(rows, dtype=cp.int32)
        self._host_token = np.zeros(rows, dtype=np.int64)
        self._host_position = np.zeros(rows, dtype=np.int32)

    def load(self, tokens: Sequence[int], kv: Any, stream: Any) -> None:
        """`tokens` at the cache's next positions into the buffers, ordered on `stream`."""
        if len(tokens) != self.rows:
            raise ValueError(f"a graph of {self.rows} rows got {len(tokens)} tokens")
        kv.positions(self.rows)  # the capacity check, on the host as usual
        self._host_token[:] = tokens
        self._host_position[:] = np.arange(kv.n_tokens, kv.n_tokens + self.rows)
        self.token.set(self._host_token, stream=stream)
        self.position.set(self._host_position, stream=stream)
