"""What the device directories' tests (the CUDA run and the CPU transliteration) check at the end of a
sequence of serves: the device's directory state and counters equal the numpy twin's."""

from __future__ import annotations

import numpy as np

from runner.offload.slot_directory import SlotDirectory


def assert_end_state_matches(device, twin: SlotDirectory) -> None:
    """`device` is a DeviceDirectories holding one layer; the sequence must have evicted and hit."""
    (state, counts), = device.pull().values()
    want = twin.state()
    for name in ("slot_of", "expert_of", "last", "count"):
        assert np.array_equal(getattr(state, name), getattr(want, name)), name
    assert (state.clock, state.filled) == (want.clock, want.filled)
    c = twin.counters
    assert counts == c  # hits, misses, evictions and prefetched
    assert c.evictions > 0 and c.hits > 0
