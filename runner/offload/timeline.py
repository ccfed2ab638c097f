"""A recorder of spans on the copy and compute streams during a prompt: (stream, layer, label, start, end).

The prefill stream opens a "copy" span around each visit's uploads, a "compute" span around each
layer's forward and, inside it, a "wait" span around the compute stream's wait for the layer's uploads
(the time its kernels sat idle behind the link; a compute span less its waits is its kernels plus any gap
where the host had not launched the next one). What a mark is depends on the clock: `WallClock` reads
perf_counter (the numpy backend: uploads are host copies, nothing overlaps; NOT GPU timings);
`CudaEventClock` records a CUDA event on the stream the span belongs to, read back after a synchronize,
so a span is the time that stream spent on the work enqueued between its two marks.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

STREAMS = ("copy", "compute", "wait")  # "wait" spans lie on the compute stream


@dataclass(frozen=True)
class Span:
    stream: str  # one of STREAMS
    layer: int
    label: str
    start_s: float  # from the timeline's origin
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Clock(Protocol):
    gpu: bool  # whether marks are GPU stream timestamps
    name: str

    def mark(self, stream: str) -> Any:
        """A point on `stream` after everything enqueued on it so far."""
        ...

    def seconds(self, mark: Any) -> float:
        """Seconds from the clock's origin to `mark` (after resolve())."""
        ...

    def resolve(self) -> None:
        """Make every mark readable (CUDA: wait for the streams)."""
        ...


class WallClock:
    gpu = False
    name = "wall clock (perf_counter): not GPU timings"

    def __init__(self) -> None:
        self.origin = time.perf_counter()

    def mark(self, stream: str) -> float:
        return time.perf_counter()

    def seconds(self, mark: float) -> float:
        return mark - self.origin

    def resolve(self) -> None:
        pass


class CudaEventClock:
    """CUDA events: copy marks on the arena's copy stream, compute and wait marks on the current stream."""

    gpu = True
    name = "CUDA events on the copy and compute streams"

    def __init__(self, copy_stream: Any):
        import cupy  # only here: the numpy backend never needs it

        self._cuda = cupy.cuda
        self._copy = copy_stream
        self._origin = self.mark("compute")

    def _stream(self, stream: str) -> Any:
        return self._copy if stream == "copy" else self._cuda.get_current_stream()

    def mark(self, stream: str) -> Any:
        if stream == "copy":
            # Every upload first waits for the compute enqueued before it (the arena's rule); waiting here
            # too, before the mark, makes a copy span time the copy rather than that wait.
            self._copy.wait_event(self._cuda.get_current_stream().record())
        event = self._cuda.Event()
        event.record(self._stream(stream))
        return event

    def seconds(self, mark: Any) -> float:
        return self._cuda.get_elapsed_time(self._origin, mark) / 1e3  # milliseconds

    def resolve(self) -> None:
        self._copy.synchronize()
        self._cuda.get_current_stream().synchronize()


class Timeline:
    """Open spans with start(), close them with stop(); spans() reads them all once the work is done."""

    def __init__(self, clock: Clock | None = None):
        self.clock: Clock = clock or WallClock()
        self._marks: list[tuple[str, int, str, Any, Any]] = []  # (stream, layer, label, start, end or None)

    def start(self, stream: str, layer: int, label: str = "") -> int:
        if stream not in STREAMS:
            raise ValueError(f"unknown stream '{stream}'; the timeline records {', '.join(STREAMS)}")
        self._marks.append((stream, layer, label, self.clock.mark(stream), None))
        return len(self._marks) - 1

    def stop(self, key: int) -> None:
        stream, layer, label, start, end = self._marks[key]
        if end is not None:
            raise ValueError(f"span {key} ({stream}, layer {layer}) is already stopped")
        self._marks[key] = (stream, layer, label, start, self.clock.mark(stream))

    def spans(self) -> list[Span]:
        """Every stopped span, in the order started (open ones are left out)."""
        self.clock.resolve()
        return [Span(s, layer, label, self.clock.seconds(a), self.clock.seconds(b))
                for s, layer, label, a, b in self._marks if b is not None]
