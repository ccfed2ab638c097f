"""size_text: the largest binary unit that keeps the number at 1 or more."""

from __future__ import annotations

from runner.units import size_text


def test_size_text_picks_the_unit_by_size() -> None:
    assert [size_text(n) for n in (0, 1023, 1024, 180 * 1024, (1 << 20) - 10240, 1 << 20, 7.3 * (1 << 20))] == [
        "0 B", "1023 B", "1.0 KiB", "180.0 KiB", "1014.0 KiB", "1.0 MiB", "7.3 MiB"]
    assert size_text(1000 << 20) == "1000.0 MiB" and size_text(1 << 30) == "1.00 GiB"
    assert size_text(45_764_050_944) == "42.62 GiB"
