"""The VRAM budget ledger: reservations add up, an overrun names what did not fit, peak is kept."""

import pytest

from runner.backends.budget import GIB, DeviceBudget
from runner.errors import DeviceMemoryError


def test_reservations_add_up_and_release_returns_the_size() -> None:
    budget = DeviceBudget(24 * GIB)
    budget.reserve("resident weights", 10 * GIB)
    budget.reserve("kv cache", 2 * GIB)
    assert budget.used_bytes == 12 * GIB and budget.free_bytes == 12 * GIB
    assert budget.release("kv cache") == 2 * GIB
    budget.reserve("prefill buffers", 13 * GIB)
    assert budget.peak_bytes == 23 * GIB


def test_overrun_names_what_did_not_fit_and_the_holders() -> None:
    budget = DeviceBudget(24 * GIB)
    budget.reserve("resident weights", 20 * GIB)
    with pytest.raises(DeviceMemoryError, match=r"expert cache \(150 slots per layer\) needs 6.00 GiB but only "
                                                r"4.00 GiB of the 24.00 GiB VRAM budget is free \(held: resident weights 20.00 GiB\)"):
        budget.reserve("expert cache (150 slots per layer)", 6 * GIB)
    assert budget.used_bytes == 20 * GIB  # a refused reservation changes nothing


def test_misuse_is_refused() -> None:
    budget = DeviceBudget(GIB)
    budget.reserve("a", 1)
    with pytest.raises(ValueError):
        budget.reserve("a", 1)
    with pytest.raises(ValueError):
        budget.release("b")
    with pytest.raises(DeviceMemoryError):
        DeviceBudget(0)


def test_check_fits_names_the_first_that_would_not_fit_and_reserves_nothing() -> None:
    budget = DeviceBudget(4 * GIB)
    budget.reserve("kv cache", GIB)
    budget.check_fits([("weight a", GIB), ("weight b", 2 * GIB)])  # exactly fills the 3 GiB left
    with pytest.raises(DeviceMemoryError, match=r"weight c needs 1.00 GiB but only 0.50 GiB of the 4.00 GiB VRAM "
                                                r"budget is free once everything before it is placed"):
        budget.check_fits([("weight a", GIB), ("weight b", GIB + GIB // 2), ("weight c", GIB), ("weight d", 1)])
    assert budget.held == {"kv cache": GIB}
