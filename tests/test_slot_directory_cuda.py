"""The device directory kernel against its numpy twin (which test_slot_directory.py holds to the slot cache):
the same slot for every pair, the same fills in order, the same counters, at the seed shape's width and at
awkward ones, under LRU and aging LFU (a short period, so counts halve often)."""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda.slot_directory import EVICTIONS, HITS, MISSES, DeviceSlotDirectory  # noqa: E402
from runner.offload.slot_directory import SlotDirectory  # noqa: E402


@pytest.mark.parametrize("policy,period", [("lru", 0), ("lfu", 0), ("lfu", 7)])
@pytest.mark.parametrize("n_expert,k,slots", [(512, 10, 150), (160, 8, 40), (37, 3, 9)])
def test_the_kernel_makes_the_twins_choices(policy: str, period: int, n_expert: int, k: int, slots: int) -> None:
    rng = np.random.default_rng(n_expert + slots)
    popularity = np.arange(1, n_expert + 1, dtype=float) ** -1.0
    popularity /= popularity.sum()
    twin, device = SlotDirectory(n_expert, slots, policy, period), DeviceSlotDirectory(n_expert, slots, policy, period)
    for _ in range(400):
        n_tok = int(rng.integers(1, min(4, slots // k) + 1))
        rows = [rng.choice(n_expert, size=k, replace=False, p=popularity) for _ in range(n_tok)]
        ids = np.stack(rows).astype(np.int32)
        want_slots, want_fills = twin.serve(ids)
        got_slots, fills = device.serve(cp.asarray(ids))
        n_fills = int(device.n_fills.get()[0])
        assert cp.asnumpy(got_slots).tolist() == want_slots.tolist()
        assert [tuple(f) for f in cp.asnumpy(fills[:n_fills]).tolist()] == want_fills
    scalars = device.scalars.get()
    c = twin.counters
    assert (scalars[HITS], scalars[MISSES], scalars[EVICTIONS]) == (c.hits, c.misses, c.evictions)
    assert c.evictions > 0 and c.hits > 0
    assert np.array_equal(device.slot_of.get(), twin.slot_of) and np.array_equal(device.count.get(), twin.count)
