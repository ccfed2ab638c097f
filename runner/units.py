"""Byte counts as people read them: binary units, the largest that keeps the number at 1 or more."""

from __future__ import annotations


def size_text(n: float) -> str:
    """GiB to two places; MiB or KiB to one; bytes as they are ('0.0 MiB' said nothing of a small expert)."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
