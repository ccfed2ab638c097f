"""The device twin of runner/offload/slot_directory.py (cuda/slot_directory.cu): one MoE layer's directory in
device arrays, served by one warp with no host round trip, so a decode graph could hold it. One launch per
serve. Not wired into decode yet (issue 20): this is the kernel and its parity with the numpy twin."""

from __future__ import annotations

import cupy as cp
import numpy as np

from runner.backends.cuda.kernels import load_module
from runner.errors import CacheError

MAX_EXPERTS = 512  # DIR_MAX_EXPERTS
MAX_PAIRS = 256  # DIR_MAX_PAIRS
CLOCK, FILLED, HITS, MISSES, EVICTIONS = range(5)  # the kernel's scalars


class DeviceSlotDirectory:
    def __init__(self, n_expert: int, n_slots: int, policy: str = "lru", period: int = 0):
        if policy not in ("lru", "lfu"):
            raise CacheError(f"unknown cache policy '{policy}'; choose from lru, lfu")
        assert 0 < n_expert <= MAX_EXPERTS, f"{n_expert} experts: the directory kernel takes 1..{MAX_EXPERTS}"
        self.n_expert, self.n_slots, self.lfu = n_expert, n_slots, policy == "lfu"
        self.period = period or 4 * n_slots  # POLICIES["lfu"]'s
        self.slot_of = cp.full(n_expert, -1, dtype=cp.int32)
        self.expert_of = cp.full(n_slots, -1, dtype=cp.int32)
        self.last = cp.zeros(n_slots, dtype=cp.int64)
        self.count = cp.zeros(n_slots, dtype=cp.float64)
        self.scalars = cp.zeros(5, dtype=cp.int64)
        self.n_fills = cp.zeros(1, dtype=cp.int32)

    def serve(self, ids: cp.ndarray) -> tuple[cp.ndarray, cp.ndarray]:
        """ids int32 [T, k] on the device -> (slot of each pair int32 [T * k], fills int32 [T * k, 2] whose first
        n_fills rows are (expert, slot) to copy, in order). The caller keeps distinct experts within the slots."""
        assert ids.dtype == cp.int32 and ids.ndim == 2 and ids.flags.c_contiguous, (
            "ids must be C-contiguous int32 [T, k]")
        n_pairs = ids.size
        assert 0 < n_pairs <= MAX_PAIRS, f"{n_pairs} pairs: the directory kernel takes 1..{MAX_PAIRS}"
        pair_slots = cp.empty(n_pairs, dtype=cp.int32)
        fills = cp.full((n_pairs, 2), -1, dtype=cp.int32)
        load_module("slot_directory").get_function("directory_serve")(
            (1,), (32,),
            (ids, np.int32(n_pairs), np.int32(ids.shape[1]), self.slot_of, self.expert_of, self.last, self.count,
             self.scalars, np.int32(self.n_expert), np.int32(self.n_slots), np.int32(self.lfu), np.int64(self.period),
             pair_slots, fills, self.n_fills))
        return pair_slots, fills
