"""The loading bar: bytes and rate while the host expert arena fills (tens of GB from the file's page cache or
the disk), drawn on stderr only when stderr is a terminal so that piped and JSON outputs stay clean."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import click

ArenaProgress = Callable[[int, int], None]  # (bytes filled so far, arena bytes), HostExpertStore's progress


def stderr_stream() -> TextIO:
    return sys.stderr


class ArenaBar:
    """HostExpertStore's progress(done, total) drawn as a click progress bar with the bytes and the rate."""

    def __init__(self, file: TextIO, label: str = "filling the host expert arena"):
        self.file, self.label = file, label
        self.bar: Any = None  # click's ProgressBar, made at the first report (which carries the total)
        self.total = 0
        self.start_s = 0.0
        self.closed = False

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.total, self.start_s = total, time.perf_counter()
            self.bar = click.progressbar(length=max(total, 1), label=self.label, file=self.file,
                                         item_show_func=self._figures)
        self.bar.update(done - self.bar.pos, done)
        if done >= total:
            self.close()

    def close(self) -> None:
        """End the bar's line (also when loading failed half-way, so an error line starts on its own)."""
        if self.bar is not None and not self.closed:
            self.closed = True
            self.bar.render_finish()

    def _figures(self, done: int | None) -> str:
        done = done or 0
        rate = done / max(time.perf_counter() - self.start_s, 1e-9)
        return f"{_bytes(done)} of {_bytes(self.total)}, {_bytes(rate)}/s"


@contextlib.contextmanager
def arena_progress(file: TextIO | None = None) -> Iterator[ArenaProgress | None]:
    """The progress callback to load an engine with: a bar on `file` (default stderr) when it is a
    terminal, else None (nothing drawn)."""
    out = file if file is not None else stderr_stream()
    if not out.isatty():
        yield None
        return
    bar = ArenaBar(out)
    try:
        yield bar
    finally:
        bar.close()


def _bytes(n: float) -> str:
    """Decimal units, as link rates are quoted (55 GB/s)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"
