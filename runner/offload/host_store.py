"""Every MoE layer's routed experts in one host arena, laid out for single-copy uploads.

Per layer the experts follow each other, each as [gate | up | down], so one expert is one
contiguous copy and one layer's whole expert set is one contiguous range. The arena is anonymous
memory that the fill's threads fault in while they copy the file; an injectable pinner then
page-locks it in place (the CUDA backend's: cudaHostRegister), because pageable host-to-device
copies run at 6-12 GB/s against about 55 GB/s pinned (H200 box). Allocating it pinned instead
(cudaHostAlloc) zeroes and locks every page on one thread: 15.0 of a 31.2 GB load's 18.8 s; 16 GiB
filled and pinned took 9.2 s that way, 1.1 s this way with transparent huge pages (H100 box,
docs/perf/2026-12-06c-pinning-h100.md).
"""

from __future__ import annotations

import logging
import mmap
import os
import time
import weakref
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
from gguf.constants import GGMLQuantizationType as QT

from runner.errors import CacheError
from runner.gguf_file import TensorInfo
from runner.models.weights import ModelWeights, MoEWeights
from runner.offload.provider import ExpertMatrices, moe_layer_index
from runner.units import size_text

log = logging.getLogger(__name__)

MATRIX_ALIGN = 16
PAGEABLE_GB_S = (6, 12)  # measured host-to-device on the H200 box
PINNED_GB_S = 55


def _aligned(n: int) -> int:
    return -(-n // MATRIX_ALIGN) * MATRIX_ALIGN


@dataclass(frozen=True)
class MatrixLayout:
    qtype: QT
    rows: int
    row_bytes: int
    offset: int  # from the expert's first byte

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


@dataclass(frozen=True)
class ExpertLayout:
    """Where one expert's three matrices sit in its contiguous bytes: [gate | up | down].

    Each matrix starts, and each expert ends, on a MATRIX_ALIGN boundary: the GEMV kernels load
    16 bytes at a time from the types whose blocks keep that alignment in a tensor of their own.
    """

    gate: MatrixLayout
    up: MatrixLayout
    down: MatrixLayout

    @property
    def expert_bytes(self) -> int:
        return _aligned(self.down.offset + self.down.nbytes)

    @classmethod
    def of(cls, w: MoEWeights) -> "ExpertLayout":
        offset, parts = 0, []
        for info in (w.gate_exps, w.up_exps, w.down_exps):
            rows, expert_nbytes = info.shape[1], info.nbytes // info.shape[0]
            parts.append(MatrixLayout(info.qtype, rows, expert_nbytes // rows, offset))
            offset = _aligned(offset + expert_nbytes)
        return cls(*parts)

    def matrices(self, expert_bytes: object, key: str) -> ExpertMatrices:
        """Views of one expert's matrices in a 1-D uint8 buffer (numpy or CuPy) holding exactly its bytes."""
        views = [expert_bytes[m.offset : m.offset + m.nbytes].reshape(m.rows, m.row_bytes)  # type: ignore[index]
                 for m in (self.gate, self.up, self.down)]
        return ExpertMatrices(*views, self.gate.qtype, self.up.qtype, self.down.qtype, key=key)


@dataclass(frozen=True)
class HostBuffer:
    array: np.ndarray  # uint8 [nbytes]
    pinned: bool


HostPinner = Callable[[np.ndarray], Callable[[], None]]  # page-locks an array in place (or raises); returns the unlock


def host_pages(nbytes: int, huge_pages: bool = False) -> np.ndarray:
    """`nbytes` of zeroed anonymous memory as uint8, no page touched yet: whoever writes first faults the pages in,
    so threads filling it share the kernel's zeroing, which cudaHostAlloc does on one thread. `huge_pages` asks
    for transparent huge pages (madvise), where the kernel has them."""
    pages = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge_pages and hasattr(mmap, "MADV_HUGEPAGE"):
        pages.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(pages, dtype=np.uint8, count=nbytes)


def available_host_bytes() -> int:
    """Host RAM the kernel can hand out without swapping (MemAvailable: free pages plus reclaimable cache, which
    the GGUF's own page cache is)."""
    import psutil

    return int(psutil.virtual_memory().available)


def _check_room(nbytes: int) -> None:
    """Say so before the fill, not by the OOM killer halfway through it: the arena's pages are only promised."""
    available = available_host_bytes()
    if nbytes > available:
        raise CacheError(f"the host expert store needs {size_text(nbytes)} of RAM for the routed experts, but only "
                         f"{size_text(available)} is available; close other programs or use a smaller model or quant")


def _unpin(unpin: Callable[[], None], arena: np.ndarray) -> None:
    """Unlock a dropped store's arena; the arena is an argument so that its pages outlive their registration."""
    try:
        unpin()
    except Exception as exc:  # a driver already torn down: the process is ending and the pages go with it
        log.debug("unpinning the host expert arena failed: %s", exc)


def pageable_cost_note(nbytes: int, reason: str) -> str:
    lo, hi = PAGEABLE_GB_S
    return (f"the host expert store ({nbytes / 2**30:.2f} GiB) is not pinned ({reason}): expert uploads run "
            f"pageable at about {lo}-{hi} GB/s instead of about {PINNED_GB_S} GB/s pinned, "
            f"{PINNED_GB_S // hi}-{PINNED_GB_S // lo}x slower prefill streaming and cache misses")


FILL_THREADS = min(8, os.cpu_count() or 1)  # threads copying the file into the arena at load


def _raw_bytes(info: TensorInfo) -> np.ndarray:
    """A [n_expert, rows, ...] tensor's bytes as uint8 [n_expert, expert_bytes] (a view of the file)."""
    return info.data.view(np.uint8).reshape(info.shape[0], -1)


def _copy_in(dest: np.ndarray, info: TensorInfo) -> int:
    """One expert matrix tensor of the file into its columns of the arena; its bytes."""
    dest[:] = _raw_bytes(info)
    return info.nbytes


class ExpertSetLayout:
    """Where every MoE layer's routed experts (trunk and NextN) sit in one host arena, without the arena:
    what a launch sizes the slot cache and staging with before anything is allocated."""

    def __init__(self, weights: ModelWeights):
        moe = [lw.ffn for lw in (*weights.layers, *(n.layer for n in weights.nextn)) if isinstance(lw.ffn, MoEWeights)]
        self._weights: dict[int, MoEWeights] = {moe_layer_index(w): w for w in moe}
        self.layers: tuple[int, ...] = tuple(self._weights)
        self._layout = {i: ExpertLayout.of(w) for i, w in self._weights.items()}
        self._n_expert = {i: w.gate_exps.shape[0] for i, w in self._weights.items()}
        self._offset: dict[int, int] = {}
        total = 0
        for i in self.layers:
            self._offset[i] = total
            total += self.layer_bytes(i)
        self.expert_set_bytes = total

    def layout(self, layer: int) -> ExpertLayout:
        return self._layout[layer]

    def n_expert(self, layer: int) -> int:
        return self._n_expert[layer]

    def expert_bytes(self, layer: int) -> int:
        return self._layout[layer].expert_bytes

    def layer_bytes(self, layer: int) -> int:
        """One layer's whole expert set."""
        return self._n_expert[layer] * self.expert_bytes(layer)

    @property
    def max_layer_bytes(self) -> int:
        return max(self.layer_bytes(i) for i in self.layers)

    def weights(self, layer: int) -> MoEWeights:
        return self._weights[layer]


class HostExpertStore(ExpertSetLayout):
    """Routed experts of every MoE layer (trunk and NextN) copied from the file into one host arena.

    `progress(done, total)` hears the arena's bytes filled so far: 0 first, then rising to exactly
    `expert_set_bytes` (alignment padding included), so a progress bar ends full. Pinning follows the fill;
    without a pinner (numpy backend) the arena stays pageable."""

    def __init__(self, weights: ModelWeights, pin_host: HostPinner | None = None,
                 progress: Callable[[int, int], None] | None = None, require_pinned: bool = False):
        super().__init__(weights)
        total = self.expert_set_bytes
        report = progress or (lambda done, total: None)
        report(0, total)
        t0 = time.perf_counter()
        _check_room(total)
        self.arena = host_pages(total, huge_pages=True)  # 16 GiB on the box: 1.14 s filled and pinned, 1.95 s without
        self._fill(report)
        t1 = time.perf_counter()
        self.pinned, self.pin_note = False, None
        if pin_host is not None:
            try:
                weakref.finalize(self, _unpin, pin_host(self.arena), self.arena).atexit = False
                self.pinned = True
            except Exception as exc:  # a pinner failing (locked-memory limit, no driver) is survivable
                self.pin_note = pageable_cost_note(total, f"pinning failed: {exc}")
                if require_pinned:
                    raise CacheError(self.pin_note) from exc
                log.warning(self.pin_note)
        # the load's two host costs, for `runner profile`: copying the file in (faulting the pages), pinning them
        self.load_seconds = {"fill_s": t1 - t0, "pin_s": time.perf_counter() - t1}

    def _fill(self, progress: Callable[[int, int], None]) -> None:
        """Copy every expert matrix tensor in from the file, on threads: numpy's copies release the GIL, and a
        file read through the page cache is bound by page faults more than by one core's copying."""
        copies = []
        for i in self.layers:
            dest = self.layer_range(i).reshape(self._n_expert[i], -1)  # [n_expert, expert_bytes]
            w, lay = self._weights[i], self._layout[i]  # alignment padding stays as mapped: zero
            copies += [(dest[:, m.offset : m.offset + m.nbytes], info)
                       for info, m in zip((w.gate_exps, w.up_exps, w.down_exps), (lay.gate, lay.up, lay.down))]
        done = 0
        with ThreadPoolExecutor(max_workers=FILL_THREADS) as pool:
            for copied in as_completed([pool.submit(_copy_in, dest, info) for dest, info in copies]):
                done += copied.result()
                progress(done, self.expert_set_bytes)
        if done != self.expert_set_bytes:  # the padding is filled too: count it, so a bar ends full
            progress(self.expert_set_bytes, self.expert_set_bytes)

    # -- bytes ------------------------------------------------------------------------------------
    def layer_range(self, layer: int) -> np.ndarray:
        start = self._offset[layer]
        return self.arena[start : start + self.layer_bytes(layer)]

    def experts(self, layer: int, first: int, count: int = 1) -> np.ndarray:
        """Experts first..first+count-1 of `layer`: one contiguous uint8 range."""
        eb = self.expert_bytes(layer)
        return self.layer_range(layer)[first * eb : (first + count) * eb]

    def matrices(self, layer: int, expert: int) -> ExpertMatrices:
        return self._layout[layer].matrices(self.experts(layer, expert), key=f"host:{id(self.arena)}:{layer}#{expert}")

    def fetch(self, w: MoEWeights, experts: Sequence[int]) -> Mapping[int, ExpertMatrices]:
        """An ExpertProvider serving straight from host RAM (checks the layout against the file)."""
        layer = moe_layer_index(w)
        return {e: self.matrices(layer, e) for e in experts}

