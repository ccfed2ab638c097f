"""The device directories (cuda/slot_directory.cu through runner/backends/cuda/slot_directory.py) against the
numpy twin, which test_slot_directory.py holds to the slot cache: after every serve the same slot for every
pair, the same fills in order, each pair's table addresses, and each held slot holding its expert's bytes,
copied from pinned host memory by the fill kernel; at the end the same state and counters. At the seed shape's
width and at awkward ones, under LRU and aging LFU (a short period too, so counts halve often), with 16-byte,
4-byte and byte-wide copies."""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda.expert_arena import pinned_host  # noqa: E402
from runner.backends.cuda.slot_directory import DeviceDirectories  # noqa: E402
from runner.offload.slot_cache import LayerGeometry  # noqa: E402
from runner.offload.slot_directory import FREE, DirectoryState, SlotDirectory  # noqa: E402
from directory_checks import assert_end_state_matches  # noqa: E402

LAYER = 7
OFFSETS = (0, 16, 32)  # gate, up and down in an expert


def _against_twin(n_expert: int, k: int, n_slots: int, policy: str, period: int, expert_bytes: int,
                  steps: int = 300) -> None:
    rng = np.random.default_rng(n_expert + n_slots + expert_bytes)
    host = pinned_host(n_expert * expert_bytes).array
    host[:] = rng.integers(0, 256, size=host.size, dtype=np.uint8)
    slots = cp.zeros(n_slots * expert_bytes, dtype=cp.uint8)
    geo = LayerGeometry(slots.data.ptr, expert_bytes, OFFSETS, host.ctypes.data)
    twin = SlotDirectory(n_expert, n_slots, policy, period)
    device = DeviceDirectories({LAYER: (n_expert, n_slots)}, policy, {LAYER: twin.period})
    empty = DirectoryState(np.full(n_expert, FREE, np.int32), np.full(n_slots, FREE, np.int32),
                           np.zeros(n_slots, np.int64), np.zeros(n_slots), 0, 0)
    device.push({LAYER: (empty, geo)})
    popularity = np.arange(1, n_expert + 1, dtype=float) ** -1.0
    popularity /= popularity.sum()
    buffers = {}
    for step in range(steps):
        rows = int(rng.integers(1, min(4, n_slots // k) + 1))
        ids = np.stack([rng.choice(n_expert, size=k, replace=False, p=popularity) for _ in range(rows)]).astype(np.int32)
        out = buffers.setdefault(rows, device.pair_buffers(rows, k))
        want_slots, want_fills = twin.serve(ids)
        device.serve(LAYER, cp.asarray(ids), out)
        cp.cuda.Device().synchronize()
        assert cp.asnumpy(out.pair_slots).tolist() == want_slots.tolist()
        n_fills = int(out.n_fills.get()[0])
        assert [tuple(f) for f in cp.asnumpy(out.fills[:n_fills]).tolist()] == want_fills
        filled = {e for e, _ in want_fills}  # the pairs the expert kernels' second pass computes (OVERLAP_FILLS)
        assert cp.asnumpy(out.fresh[: ids.size]).tolist() == [int(e in filled) for e in ids.reshape(-1).tolist()]
        at = np.uint64(geo.slot0) + want_slots.astype(np.uint64) * np.uint64(expert_bytes)
        assert np.array_equal(cp.asnumpy(out.table), np.stack([at + np.uint64(o) for o in OFFSETS]))
        held = cp.asnumpy(slots).reshape(n_slots, expert_bytes)
        for e in np.flatnonzero(twin.slot_of != FREE):
            assert np.array_equal(held[twin.slot_of[e]], host[e * expert_bytes : (e + 1) * expert_bytes]), (step, e)
    assert_end_state_matches(device, twin)


@pytest.mark.parametrize("policy,period", [("lru", 0), ("lfu", 0), ("lfu", 7)])
@pytest.mark.parametrize("n_expert,k,slots", [(512, 10, 150), (160, 8, 40), (37, 3, 9)])
def test_the_kernels_make_the_twins_choices_and_fill_the_slots(policy: str, period: int, n_expert: int, k: int,
                                                               slots: int) -> None:
    _against_twin(n_expert, k, slots, policy, period, expert_bytes=4096 + 160)


@pytest.mark.parametrize("expert_bytes", [1000, 999])  # 4-byte and byte-wide copies
def test_the_fill_copies_experts_of_any_size(expert_bytes: int) -> None:
    _against_twin(40, 3, 9, "lfu", 11, expert_bytes)
