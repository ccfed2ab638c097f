"""cuda/slot_directory.cu on the CPU: a line-by-line Python transliteration of directory_serve and directory_fill,
launched through the real launcher (runner/backends/cuda/slot_directory.py, DeviceDirectories) over a stand-in
for CuPy, held to the numpy twin (SlotDirectory) and to the slot cache across handoffs.

The serve kernel runs as 32 lanes (one Python generator each, with its own registers) stepped together to
each __syncwarp and __shfl_*_sync, so every lane takes the kernel's own branches on its own copies of
clock, filled and slot, and a shuffle that not all 32 lanes reach fails. Between two __syncwarp a lane's
accesses are checked against the other lanes': a write and another lane's access of the same bytes is a
race, except a read that an intervening shuffle orders before the write. The fill kernel runs block by
block, thread by thread in vectorized form (each thread's strided words), with the width the kernel picks;
a 16- or 4-byte word must be aligned on both sides, the threads' words must cover the expert exactly once,
and two fills of one launch must not write the same bytes. Pointer arguments are re-read as the kernel's
parameter types (an int32 buffer passed for a long long* is refused; scalars must be the numpy type of the
C type), every index the kernels make is held to the extent its buffer has, and every address the fill
dereferences must lie in memory the test registered (the slots, the host store).

What this cannot show: real memory ordering and timing between lanes (the checker flags unordered
conflicting accesses instead), CUDA's behaviour on a fault, and real PCIe reads of pinned memory.
The GPU test of the same kernels is tests/test_slot_directory_cuda.py.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from functools import cache
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.budget import GIB, DeviceBudget
from runner.offload.device_arena import EmulatedDeviceArena
from runner.offload.host_store import ExpertLayout, MatrixLayout
from runner.offload.policies import POLICIES
from runner.offload.slot_cache import ExpertSlotCache, LayerGeometry
from runner.offload.slot_directory import FREE, DirectoryState, SlotDirectory
from directory_checks import assert_end_state_matches

ROOT = Path(__file__).resolve().parents[1]
U64 = (1 << 64) - 1
INT64_MAX = 0x7FFFFFFFFFFFFFFF
DIR_MAX_EXPERTS, DIR_MAX_PAIRS = 512, 256


# -- memory the kernels can address ---------------------------------------------------------------------
class Memory:
    """Every buffer a kernel may dereference, by address: device arrays, slots, the pinned host store."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int, np.ndarray, str]] = []  # start, end, uint8 view, kind

    def register(self, array: np.ndarray, kind: str = "device") -> None:
        u8 = np.asarray(array).reshape(-1).view(np.uint8)
        start = u8.ctypes.data
        self.ranges = [r for r in self.ranges if not (r[0] == start and r[1] == start + u8.size)]
        self.ranges.append((start, start + u8.size, u8, kind))

    def find(self, address: int, nbytes: int) -> tuple[np.ndarray, int, str]:
        hits = [(u8, address - start, kind) for start, end, u8, kind in self.ranges
                if start <= address and address + nbytes <= end]
        assert hits, f"address {address:#x} (+{nbytes}) is in no buffer the kernel may read or write"
        return max(hits, key=lambda h: h[0].size)  # an allocation, not a view registered inside it

    def bytes(self, address: int, nbytes: int) -> np.ndarray:
        u8, offset, _kind = self.find(address, nbytes)
        return u8[offset : offset + nbytes]

    def kind(self, address: int) -> str | None:
        for start, end, _u8, kind in self.ranges:
            if start <= address < end:
                return kind
        return None


MEMORY = Memory()


@pytest.fixture(autouse=True)
def _fresh_memory():
    MEMORY.ranges.clear()
    yield
    MEMORY.ranges.clear()


# -- a CuPy stand-in for DeviceDirectories ----------------------------------------------------------------
class DevArray(np.ndarray):
    """A device array: numpy memory the kernels' transliterations address."""

    def set(self, host: np.ndarray, stream=None) -> None:
        np.copyto(self, np.asarray(host).reshape(self.shape))

    def get(self, stream=None, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return np.array(self)
        assert out.shape == self.shape and out.dtype == self.dtype
        np.copyto(out, self)
        return out


def _device(array: np.ndarray) -> DevArray:
    return np.ascontiguousarray(array).copy().view(DevArray)


def _stub_cupy() -> ModuleType:
    cp = ModuleType("cupy")
    cp.int32, cp.int64, cp.uint8, cp.uint64, cp.float64 = np.int32, np.int64, np.uint8, np.uint64, np.float64
    cp.ndarray = DevArray
    cp.zeros = lambda shape, dtype=np.float64: _device(np.zeros(shape, dtype=dtype))
    cp.asarray = lambda a, dtype=None: _device(np.asarray(a, dtype=dtype))

    def alloc_pinned_memory(nbytes: int) -> bytearray:
        memory = bytearray(nbytes)
        MEMORY.register(np.frombuffer(memory, dtype=np.uint8), "pinned")
        return memory

    def pointer_attributes(address: int) -> SimpleNamespace:
        kind = MEMORY.kind(address)
        return SimpleNamespace(type=1 if kind == "pinned" else 2 if kind == "device" else 0, devicePointer=address)

    class Stream:  # the kernels run as they are launched: a stream only keeps the order of its records
        def __init__(self, non_blocking: bool = False):
            self.records: list[Event] = []

        def synchronize(self) -> None:
            pass

        def wait_event(self, event: "Event") -> None:
            pass

        def __enter__(self) -> "Stream":
            return self

        def __exit__(self, *exc) -> None:
            pass

    class Event:
        def __init__(self, disable_timing: bool = False):
            self.after_fills = -1  # how many fills had run when recorded

        def record(self, stream: Stream) -> None:
            self.after_fills = len(FILL_LOG)
            stream.records.append(self)

    current = Stream()
    cp.cuda = SimpleNamespace(alloc_pinned_memory=alloc_pinned_memory, Stream=Stream, Event=Event,
                              get_current_stream=lambda: current,
                              Device=lambda: SimpleNamespace(synchronize=lambda: None),
                              runtime=SimpleNamespace(pointerGetAttributes=pointer_attributes))
    return cp


# -- the kernels' parameters as the .cu declares them -------------------------------------------------------
C_TYPES = {"int": np.int32, "long long": np.int64, "double": np.float64, "unsigned long long": np.uint64,
           "unsigned char": np.uint8}


@cache
def _kernel_params(name: str) -> list[tuple[str, bool, str]]:
    """(C type, is pointer, name) of each parameter of `name` in cuda/slot_directory.cu."""
    source = (ROOT / "cuda" / "slot_directory.cu").read_text()
    m = re.search(r'extern "C" __global__ void\s+(?:__launch_bounds__\(\d+\)\s*)?' + name + r"\s*\(([^)]*)\)", source, re.DOTALL)
    assert m, f"no kernel {name} in cuda/slot_directory.cu"
    out = []
    for p in m.group(1).split(","):
        p = re.sub(r"\b(const|__restrict__)\b", " ", p)
        pm = re.fullmatch(r"\s*([a-z ]+?)\s*(\*?)\s*(\w+)\s*", p)
        assert pm, p
        out.append((pm.group(1).strip(), bool(pm.group(2)), pm.group(3)))
    return out


class Ptr:
    """A kernel's pointer parameter: the memory at the argument's address read as the parameter's C type,
    indices held to `extent` (what the kernel's contract gives that buffer), accesses shown to a checker."""

    def __init__(self, name: str, array: np.ndarray | None, dtype, extent: int, checker=None):
        self.name, self.extent, self.checker = name, extent, checker
        self.null = array is None
        if self.null:
            return
        itemsize = np.dtype(dtype).itemsize
        address = array.ctypes.data
        assert address % itemsize == 0, f"{name}: {address:#x} is not aligned for its type"
        root = array  # the allocation the argument points into: the kernel may index it to its extent only
        while isinstance(root.base, np.ndarray):
            root = root.base
        u8 = root.reshape(-1).view(np.uint8)
        offset = address - u8.ctypes.data
        assert 0 <= offset and offset + extent * itemsize <= u8.size, f"{name}: {extent} elements overrun its buffer"
        self.view = u8[offset : offset + extent * itemsize].view(dtype)
        self.base = address

    def _at(self, i: int) -> int:
        assert 0 <= i < self.extent, f"{self.name}[{i}] outside its {self.extent} elements"
        return self.base + i * self.view.itemsize

    def ld(self, lane: int, i: int):
        at = self._at(i)
        if self.checker is not None:
            self.checker.access(lane, at, self.view.itemsize, False, self.name)
        v = self.view[i]
        return float(v) if self.view.dtype.kind == "f" else int(v)

    def st(self, lane: int, i: int, value) -> None:
        at = self._at(i)
        if self.checker is not None:
            self.checker.access(lane, at, self.view.itemsize, True, self.name)
        self.view[i] = value


def _scalar(name: str, value, ctype: str):
    want = C_TYPES[ctype]
    assert type(value) is want, f"{name}: a {type(value).__name__} passed for a {ctype} (cupy packs by numpy type)"
    return int(value)


def _pointer_arg(name: str, value, ctype: str) -> np.ndarray | None:
    if value is None or (isinstance(value, (int, np.integer)) and int(value) == 0):
        return None
    assert isinstance(value, np.ndarray), f"{name}: a {type(value).__name__} passed for a {ctype}*"
    assert value.dtype == C_TYPES[ctype], f"{name}: a {value.dtype} buffer passed for a {ctype}*"
    return value


def _bind(kernel: str, args: tuple) -> dict:
    params = _kernel_params(kernel)
    assert len(args) == len(params), f"{kernel}: {len(args)} arguments for {len(params)} parameters"
    return {name: (_pointer_arg(name, a, ctype) if ptr else _scalar(name, a, ctype))
            for (ctype, ptr, name), a in zip(params, args)}


# -- races between lanes ----------------------------------------------------------------------------------
class RaceChecker:
    """Accesses between two __syncwarp: (lane, write, epoch) per byte address, an epoch ending at each shuffle."""

    def __init__(self) -> None:
        self.phase: dict[int, list[tuple[int, bool, int, str]]] = {}
        self.epoch = 0

    def syncwarp(self) -> None:
        self.phase, self.epoch = {}, self.epoch + 1

    def shuffle(self) -> None:
        self.epoch += 1

    def access(self, lane: int, address: int, size: int, write: bool, name: str) -> None:
        for a in range(address, address + size):
            seen = self.phase.setdefault(a, [])
            for other, other_write, epoch, other_name in seen:
                if other == lane or not (write or other_write):
                    continue
                if write and not other_write and epoch < self.epoch:
                    continue  # a read a shuffle (all 32 lanes) ordered before this write
                raise AssertionError(f"race: lane {lane} {'writes' if write else 'reads'} {name} while lane {other} "
                                     f"{'wrote' if other_write else 'read'} {other_name} with no __syncwarp between")
            seen.append((lane, write, self.epoch, name))


# -- directory_serve, lane by lane -------------------------------------------------------------------------
SYNC = ("sync",)


def _serve_lane(lane: int, a: SimpleNamespace, sh: SimpleNamespace):
    """One lane of directory_serve: yields SYNC at __syncwarp, ("down"|"idx", value, lane offset or source)
    at a shuffle and gets the shuffled value back. Line for line the kernel."""
    n_pairs, k, n_expert, n_slots, lfu, period = a.n_pairs, a.k, a.n_expert, a.n_slots, a.lfu, a.period
    prefetch = a.prefetch
    per_lane = DIR_MAX_EXPERTS // 32  # load_directory (before or after the PDL wait: early): loads, then stores
    slot_v = [a.slot_of.ld(lane, lane + 32 * i) if lane + 32 * i < n_expert else 0 for i in range(per_lane)]
    expert_v = [a.expert_of.ld(lane, lane + 32 * i) if lane + 32 * i < n_slots else 0 for i in range(per_lane)]
    last_v = [a.last.ld(lane, lane + 32 * i) if lane + 32 * i < n_slots else 0 for i in range(per_lane)]
    count_v = [a.count.ld(lane, lane + 32 * i) if lfu and lane + 32 * i < n_slots else 0.0 for i in range(per_lane)]
    for i in range(per_lane):
        e = lane + 32 * i
        if e < n_expert:
            sh.protect.st(lane, e, 0)
            sh.slot_of.st(lane, e, slot_v[i])
        if e < n_slots:
            sh.expert_of.st(lane, e, expert_v[i])
            sh.last.st(lane, e, last_v[i])
            sh.count.st(lane, e, count_v[i])
    if lane == 0:
        sh.clock.st(lane, 0, a.scalars.ld(lane, 0))
        sh.filled.st(lane, 0, a.scalars.ld(lane, 1))
    if not a.geometry.null and lane < 6:
        sh.geometry.st(lane, lane, a.geometry.ld(lane, lane))
    for i in range(DIR_MAX_PAIRS // 32):  # PDL_ENTRY(), then the router's ids
        if lane + 32 * i < n_pairs:
            sh.ids.st(lane, lane + 32 * i, a.ids.ld(lane, lane + 32 * i))
    yield SYNC
    if lane == 0:
        n = 0
        t = int(n_pairs / k) - 1  # C division of positive ints
        while t >= 0:
            for j in range(k):
                e = sh.ids.ld(lane, t * k + j)
                if not sh.protect.ld(lane, e):
                    sh.protect.st(lane, e, 1)
                    sh.wanted.st(lane, n, e)
                    n += 1
            t -= 1
        sh.n_wanted.st(lane, 0, n)
    yield SYNC
    clock, filled, hits, misses, evictions = sh.clock.ld(lane, 0), sh.filled.ld(lane, 0), 0, 0, 0
    prefetched = 0
    n_fill = 0
    w = sh.n_wanted.ld(lane, 0) - 1
    while w >= 0:
        e = sh.wanted.ld(lane, w)
        slot = FREE
        if lane == 0:
            slot = sh.slot_of.ld(lane, e)
        slot = yield ("idx", slot, 0)
        if slot != FREE:
            if lane == 0 and not prefetch:
                hits += 1
        else:
            if filled < n_slots:
                slot = filled
                filled += 1
            else:
                best_count, best_last, best = 1e300, INT64_MAX, n_slots
                for s in range(lane, n_slots, 32):
                    if sh.protect.ld(lane, sh.expert_of.ld(lane, s)):
                        continue
                    c = sh.count.ld(lane, s) if lfu else 0.0
                    if c < best_count or (c == best_count and sh.last.ld(lane, s) < best_last):
                        best_count, best_last, best = c, sh.last.ld(lane, s), s
                off = 16
                while off > 0:
                    oc = yield ("down", best_count, off)
                    ol = yield ("down", best_last, off)
                    os_ = yield ("down", best, off)
                    if oc < best_count or (oc == best_count and (ol < best_last or (ol == best_last and os_ < best))):
                        best_count, best_last, best = oc, ol, os_
                    off >>= 1
                slot = yield ("idx", best, 0)
                if lane == 0:
                    sh.slot_of.st(lane, sh.expert_of.ld(lane, slot), FREE)
                    evictions += 1
            if lane == 0:
                sh.slot_of.st(lane, e, slot)
                sh.expert_of.st(lane, slot, e)
                sh.count.st(lane, slot, 0.0)
                if prefetch:
                    prefetched += 1
                else:
                    misses += 1
                a.fills.st(lane, 2 * n_fill, e)
                a.fills.st(lane, 2 * n_fill + 1, slot)
                sh.protect.st(lane, e, 2)
            n_fill += 1
        clock += 1
        if lane == 0:
            sh.last.st(lane, slot, clock)
            if lfu:
                sh.count.st(lane, slot, sh.count.ld(lane, slot) + 1.0)
        yield SYNC
        if lfu and clock % period == 0:  # both positive: C's % is Python's
            for s in range(lane, filled, 32):
                sh.count.st(lane, s, sh.count.ld(lane, s) * 0.5)
        yield SYNC
        w -= 1
    for p in range(lane, 0 if prefetch else n_pairs, 32):
        e = sh.ids.ld(lane, p)
        slot = sh.slot_of.ld(lane, e)
        a.pair_slots.st(lane, p, slot)
        if not a.fresh.null:
            f = 1 if sh.protect.ld(lane, e) == 2 else 0
            if not a.pending.null:
                for i in range(a.n_pending.ld(lane, 0)):
                    f |= 1 if a.pending.ld(lane, 2 * i) == e else 0
            a.fresh.st(lane, p, f)
        if not a.geometry.null:
            at = (sh.geometry.ld(lane, 0) + (slot & U64) * sh.geometry.ld(lane, 1)) & U64
            for m in range(3):
                a.table.st(lane, m * a.table_stride + p, (at + sh.geometry.ld(lane, 2 + m)) & U64)
    for e in range(lane, n_expert, 32):
        a.slot_of.st(lane, e, sh.slot_of.ld(lane, e))
    for s in range(lane, n_slots, 32):
        a.expert_of.st(lane, s, sh.expert_of.ld(lane, s))
        a.last.st(lane, s, sh.last.ld(lane, s))
        if lfu:
            a.count.st(lane, s, sh.count.ld(lane, s))
    if lane == 0:
        a.scalars.st(lane, 0, clock)
        a.scalars.st(lane, 1, filled)
        a.scalars.st(lane, 2, a.scalars.ld(lane, 2) + hits)
        a.scalars.st(lane, 3, a.scalars.ld(lane, 3) + misses)
        a.scalars.st(lane, 4, a.scalars.ld(lane, 4) + evictions)
        a.scalars.st(lane, 5, a.scalars.ld(lane, 5) + prefetched)
        a.n_fills.st(lane, 0, n_fill)


def directory_serve(grid, block, args) -> None:
    assert tuple(grid) == (1,) and tuple(block) == (32,), "one warp: __launch_bounds__(32), __syncwarp, full masks"
    b = _bind("directory_serve", args)
    n_pairs, k, n_expert, n_slots = b["n_pairs"], b["k"], b["n_expert"], b["n_slots"]
    assert 0 < n_pairs <= DIR_MAX_PAIRS and n_pairs % k == 0 and 0 < n_expert <= DIR_MAX_EXPERTS
    checker = RaceChecker()
    types = {name: C_TYPES[ctype] for ctype, _ptr, name in _kernel_params("directory_serve")}
    extents = {"ids": n_pairs, "slot_of": n_expert, "expert_of": n_slots, "last": n_slots, "count": n_slots,
               "scalars": 6, "pair_slots": n_pairs, "fills": 2 * n_pairs, "n_fills": 1, "geometry": 6,
               "table": 3 * b["table_stride"], "fresh": n_pairs, "n_pending": 1,
               "pending": b["pending"].size if b["pending"] is not None else 0}
    assert b["table"] is None or b["table_stride"] >= n_pairs
    a = SimpleNamespace(**{n: v for n, v in b.items() if not isinstance(v, np.ndarray) and v is not None})
    for name, extent in extents.items():
        setattr(a, name, Ptr(name, b[name], types[name], extent, checker))
    assert b["table"] is not None or b["geometry"] is None
    assert 0 < n_slots <= n_expert, "the shared copies hold DIR_MAX_EXPERTS slots"
    # the kernel's __shared__ arrays, each its own allocation (its own addresses for the race checker)
    sh = SimpleNamespace(**{name: Ptr(name, np.zeros(n, dtype=dtype), dtype, n, checker) for name, dtype, n in (
        ("wanted", np.int32, DIR_MAX_PAIRS), ("protect", np.uint8, DIR_MAX_EXPERTS), ("n_wanted", np.int32, 1),
        ("slot_of", np.int32, DIR_MAX_EXPERTS), ("expert_of", np.int32, DIR_MAX_EXPERTS),
        ("last", np.int64, DIR_MAX_EXPERTS), ("count", np.float64, DIR_MAX_EXPERTS), ("ids", np.int32, DIR_MAX_PAIRS),
        ("clock", np.int64, 1), ("filled", np.int64, 1), ("geometry", np.uint64, 6))})
    lanes = [_serve_lane(lane, a, sh) for lane in range(32)]
    sent: list = [None] * 32
    while True:
        at = []
        for lane, gen in enumerate(lanes):
            try:
                at.append(gen.send(sent[lane]))
            except StopIteration:
                at.append(None)
        if all(x is None for x in at):
            return
        assert all(x is not None for x in at), "a lane left the kernel while the others wait at a sync (divergence)"
        kinds = {x[0] for x in at}
        assert len(kinds) == 1, f"lanes at different barriers: {kinds}"
        if at[0] == SYNC:
            checker.syncwarp()
            sent = [None] * 32
            continue
        kind = at[0][0]
        assert len({x[2] for x in at}) == 1, "lanes shuffling with different offsets or sources"
        values = [x[1] for x in at]
        if kind == "down":
            off = at[0][2]
            sent = [values[lane + off] if lane + off < 32 else values[lane] for lane in range(32)]
        else:
            sent = [values[at[0][2]]] * 32
        checker.shuffle()


# -- directory_fill, block by block --------------------------------------------------------------------------
FILL_LOG: list[dict] = []


def directory_fill(grid, block, args) -> None:
    gx, gy = tuple(grid)
    (bd,) = tuple(block)
    assert bd <= 256, "__launch_bounds__(256)"
    b = _bind("directory_fill", args)
    n_fills = Ptr("n_fills", b["n_fills"], np.int32, 1).ld(0, 0)
    fills = Ptr("fills", b["fills"], np.int32, 2 * gy)
    geometry = Ptr("geometry", b["geometry"], np.uint64, 6)
    written: list[tuple[int, int]] = []
    stride = gx * bd
    part = b["part"]
    for f in range(gy):  # blockIdx.y
        if f >= n_fills:
            continue  # every block of this row returns at once
        size, split = geometry.ld(0, 1), geometry.ld(0, 4)
        lo = split if part == 2 else 0
        nbytes = (split if part == 1 else size) - lo
        src = (geometry.ld(0, 5) + (fills.ld(0, 2 * f) & U64) * size + lo) & U64
        dst = (geometry.ld(0, 0) + (fills.ld(0, 2 * f + 1) & U64) * size + lo) & U64
        word = 16 if ((src | dst | nbytes) & 15) == 0 else 4 if ((src | dst | nbytes) & 3) == 0 else 1
        assert src % word == 0 and dst % word == 0 and nbytes % word == 0, "a misaligned vector access"
        n_words = nbytes // word
        s = MEMORY.bytes(src, n_words * word).reshape(n_words, word)
        assert MEMORY.kind(src) == "pinned", "the fill reads host memory the device does not map"
        d = MEMORY.bytes(dst, n_words * word).reshape(n_words, word)
        covered = np.zeros(n_words, dtype=np.int32)
        steps = np.arange(-(-n_words // stride), dtype=np.int64)
        for bx in range(gx):  # blockIdx.x: thread t copies words i = first; i < n_words; i += stride
            first = bx * bd + np.arange(bd, dtype=np.int64)  # blockIdx.x * blockDim.x + threadIdx.x
            i = (first[:, None] + stride * steps[None, :]).reshape(-1)
            i = i[i < n_words]
            d[i] = s[i]
            np.add.at(covered, i, 1)
        assert np.all(covered == 1), "the threads' words do not cover the expert exactly once"
        for lo, hi in written:
            assert hi <= dst or dst + nbytes <= lo, "two fills of one launch write the same bytes"
        written.append((dst, dst + nbytes))
        FILL_LOG.append({"word": word, "nbytes": nbytes, "part": part})


class SimModule:
    def get_function(self, name: str):
        return {"directory_serve": directory_serve, "directory_fill": directory_fill}[name]


@pytest.fixture(scope="module")
def sd() -> ModuleType:
    """runner/backends/cuda/slot_directory.py imported over the CuPy stand-in (under its own name, so the
    real module stays unimported), its kernels the transliterations."""
    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = _stub_cupy()
    try:
        spec = importlib.util.spec_from_file_location("slot_directory_on_cpu",
                                                      ROOT / "runner/backends/cuda/slot_directory.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    finally:
        if saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved
    module.load_module = lambda name, defines=(): SimModule()
    return module


def _aligned_buffer(nbytes: int, kind: str, misalign: int = 0) -> np.ndarray:
    raw = np.zeros(nbytes + 512, dtype=np.uint8)
    start = (-raw.ctypes.data) % 256 + misalign
    out = raw[start : start + nbytes]
    MEMORY.register(raw, kind)
    return out


def _batches(rng: np.random.Generator, n_expert: int, k: int, n: int, max_rows: int = 3) -> list[np.ndarray]:
    """tests/test_directory_handoff.py's sequences: Zipf-like popularity, 1..3 rows of distinct top-k."""
    p = np.arange(1, n_expert + 1, dtype=float) ** -1.1
    p /= p.sum()
    return [np.stack([rng.choice(n_expert, size=k, replace=False, p=p) for _ in range(rng.integers(1, max_rows + 1))])
            .astype(np.int32) for _ in range(n)]


# -- the kernels against the twin --------------------------------------------------------------------------
def _against_twin(sd, n_expert: int, k: int, n_slots: int, policy: str, period: int, expert_bytes: int,
                  steps: int, misalign: int = 0, max_rows: int = 3, split: bool | None = None) -> SlotDirectory:
    """`split` None: the fills in order on the current stream; else on a fill stream, gate and up first when True."""
    rng = np.random.default_rng(n_expert + n_slots + expert_bytes)
    host = _aligned_buffer(n_expert * expert_bytes, "pinned", misalign)
    host[:] = rng.integers(0, 256, size=host.size, dtype=np.uint8)
    slots = _aligned_buffer(n_slots * expert_bytes, "device")
    offsets = (0, 16, 32)
    geo = LayerGeometry(slots.ctypes.data, expert_bytes, offsets, host.ctypes.data)
    twin = SlotDirectory(n_expert, n_slots, policy, period)
    layer = 7
    device = sd.DeviceDirectories({layer: (n_expert, n_slots)}, policy, {layer: twin.period})
    empty = DirectoryState(np.full(n_expert, FREE, np.int32), np.full(n_slots, FREE, np.int32),
                           np.zeros(n_slots, np.int64), np.zeros(n_slots), 0, 0)
    device.push({layer: (empty, geo)})
    buffers: dict[int, object] = {}
    for step, ids in enumerate(_batches(rng, n_expert, k, steps, max_rows)):
        rows = ids.shape[0]
        if rows not in buffers:
            buffers[rows] = device.pair_buffers(rows, k)
        out = buffers[rows]
        want_slots, want_fills = twin.serve(ids)
        fills_before = len(FILL_LOG)
        events = device.serve(layer, sd.cp.asarray(ids), out, None if split is None else sd.cp.cuda.Stream(), split)
        if split is None:
            assert events is None
        else:  # each event recorded after the launches whose bytes it stands for
            parts = [f["part"] for f in FILL_LOG[fills_before:]]  # one entry a fill of a launch
            assert parts == sorted(parts) and parts.count(1) == (parts.count(2) if split else 0), step
            gate_up_done = fills_before + parts.count(1)
            assert events[0].after_fills == gate_up_done if split else events[0] is events[1], step
            assert events[1].after_fills == len(FILL_LOG), step
        assert out.pair_slots.tolist() == want_slots.tolist(), step
        n_fills = int(out.n_fills[0])
        assert [tuple(f) for f in out.fills[:n_fills].tolist()] == want_fills, step
        filled = {e for e, _ in want_fills}
        assert out.fresh[: ids.size].tolist() == [int(e in filled) for e in ids.reshape(-1).tolist()], step
        at = np.uint64(geo.slot0) + want_slots.astype(np.uint64) * np.uint64(expert_bytes)
        assert np.array_equal(out.table, np.stack([at + np.uint64(o) for o in offsets])), step
        held = slots.reshape(n_slots, expert_bytes)
        for e in np.flatnonzero(twin.slot_of != FREE):
            assert np.array_equal(held[twin.slot_of[e]], host[e * expert_bytes : (e + 1) * expert_bytes]), (step, e)
    assert_end_state_matches(device, twin)
    return twin


@pytest.mark.parametrize("policy,period", [("lru", 0), ("lfu", 0), ("lfu", 7)])
@pytest.mark.parametrize("n_expert,k,slots,steps", [(512, 10, 150, 50), (160, 8, 40, 40), (37, 3, 9, 60)])
def test_the_transliterated_kernels_make_the_twins_choices(sd, policy, period, n_expert, k, slots, steps) -> None:
    FILL_LOG.clear()
    _against_twin(sd, n_expert, k, slots, policy, period, expert_bytes=4096 + 160, steps=steps)
    assert {f["word"] for f in FILL_LOG} == {16}


@pytest.mark.parametrize("split", [False, True])
def test_fills_on_a_stream_of_their_own_and_split_at_the_down_fill_whole_experts(sd, split: bool) -> None:
    """serve with a fill stream (token_graph's OVERLAP_FILLS): whole experts in one launch, or (SPLIT_FILLS) their
    gate and up bytes in one and their down bytes in the next, with an event after each; the slots end the same."""
    FILL_LOG.clear()
    _against_twin(sd, 160, 8, 40, "lru", 0, expert_bytes=4096 + 160, steps=30, split=split)
    if split:
        assert {(f["part"], f["nbytes"]) for f in FILL_LOG} == {(1, 32), (2, 4096 + 160 - 32)}
    else:
        assert {(f["part"], f["nbytes"]) for f in FILL_LOG} == {(0, 4096 + 160)}


@pytest.mark.parametrize("expert_bytes,misalign,word", [(1000, 0, 4), (999, 0, 1), (4256, 4, 4), (4256, 1, 1)])
def test_the_fill_picks_its_word_by_both_addresses_and_the_size(sd, expert_bytes, misalign, word) -> None:
    FILL_LOG.clear()
    _against_twin(sd, 40, 3, 9, "lfu", 11, expert_bytes, steps=40, misalign=misalign)
    assert {f["word"] for f in FILL_LOG} == {word}


@pytest.mark.parametrize("overlap", [False, True], ids=["in-order", "fill-stream"])
@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("n_expert,k,slots", [(512, 10, 150), (37, 3, 9)])
def test_prefetches_between_serves_make_the_twins_choices(sd, policy: str, n_expert: int, k: int, slots: int,
                                                          overlap: bool) -> None:
    """The prefetch mode (a layer's guesses at its next batch, token_graph's PREFETCH_DEPTH) between serves: the
    same fills as the twin's prefetch, their bytes in the slots, then each serve's choices, and counters that keep
    the prefetches apart from the batches' misses. On a fill stream (token_graph's OVERLAP_FILLS) the prefetch's
    event comes after its walk and before its fills, and the serve that takes it as `pending` flags the pairs of
    its prefetched experts as fresh too, since their bytes may still be crossing."""
    rng = np.random.default_rng(n_expert + slots)
    expert_bytes = 1024
    host = _aligned_buffer(n_expert * expert_bytes, "pinned")
    host[:] = rng.integers(0, 256, size=host.size, dtype=np.uint8)
    slot_memory = _aligned_buffer(slots * expert_bytes, "device")
    geo = LayerGeometry(slot_memory.ctypes.data, expert_bytes, (0, 16, 32), host.ctypes.data)
    twin = SlotDirectory(n_expert, slots, policy)
    layer = 2
    device = sd.DeviceDirectories({layer: (n_expert, slots)}, policy, {layer: twin.period})
    empty = DirectoryState(np.full(n_expert, FREE, np.int32), np.full(slots, FREE, np.int32), np.zeros(slots, np.int64),
                           np.zeros(slots), 0, 0)
    device.push({layer: (empty, geo)})
    batches = _batches(rng, n_expert, k, 40, max_rows=2)
    for step, ids in enumerate(batches):
        d = max(1, k // 2)
        guesses = ids[:, :d].copy()  # the batch's best half, a third of them guessed wrong (repeats are fine)
        wrong = rng.random(guesses.shape) < 1 / 3
        guesses[wrong] = rng.integers(0, n_expert, size=int(wrong.sum()))
        pre = device.pair_buffers(ids.shape[0], k), sd.PrefetchBuffers.make(guesses.shape[0], d)
        want_prefetched = twin.prefetch(guesses)
        stream = sd.cp.cuda.Stream() if overlap else None
        fills_before = len(FILL_LOG)
        walked = device.prefetch(layer, sd.cp.asarray(guesses.astype(np.int32)), pre[1], stream)
        assert (walked.after_fills == fills_before) if overlap else walked is None, step
        assert len(FILL_LOG) - fills_before == len(want_prefetched), step
        assert [tuple(f) for f in pre[1].fills[: int(pre[1].n_fills[0])].tolist()] == want_prefetched, step
        want_slots, want_fills = twin.serve(ids)
        device.serve(layer, sd.cp.asarray(ids), pre[0], stream, False, pre[1] if overlap else None)
        assert pre[0].pair_slots.tolist() == want_slots.tolist(), step
        assert [tuple(f) for f in pre[0].fills[: int(pre[0].n_fills[0])].tolist()] == want_fills, step
        fresh = {e for e, _ in want_fills} | ({e for e, _ in want_prefetched} if overlap else set())
        assert pre[0].fresh[: ids.size].tolist() == [int(e in fresh) for e in ids.reshape(-1).tolist()], step
        held = slot_memory.reshape(slots, expert_bytes)
        for e in np.flatnonzero(twin.slot_of != FREE):
            assert np.array_equal(held[twin.slot_of[e]], host[e * expert_bytes : (e + 1) * expert_bytes]), (step, e)
    assert twin.counters.prefetched > 0 and twin.counters.misses > 0
    assert_end_state_matches(device, twin)


def test_the_widest_batch_the_kernel_takes(sd) -> None:
    """256 pairs (DIR_MAX_PAIRS) of 512 experts (DIR_MAX_EXPERTS): the shared arrays' bounds."""
    _against_twin(sd, 512, 8, 256, "lfu", 0, 4096, steps=25, max_rows=32)


# -- the slot cache taking turns with the transliterated device ---------------------------------------------
class ToyStore:
    """What ExpertSlotCache reads of a HostExpertStore, for any expert count, in pinned-looking memory."""

    def __init__(self, layers: tuple[int, ...], n_expert: int, rows: int = 4, row_bytes: int = 272):
        gate = MatrixLayout(QT.Q8_0, rows, row_bytes, 0)
        up = MatrixLayout(QT.Q8_0, rows, row_bytes, rows * row_bytes)
        down = MatrixLayout(QT.Q8_0, rows, row_bytes, 2 * rows * row_bytes)
        self._layout, self.layers, self._n = ExpertLayout(gate, up, down), layers, n_expert
        eb = self._layout.expert_bytes
        self.arena = _aligned_buffer(len(layers) * n_expert * eb, "pinned")
        self.arena[:] = np.random.default_rng(5).integers(0, 256, size=self.arena.size, dtype=np.uint8)
        self._weights = {i: SimpleNamespace(gate_exps=SimpleNamespace(name=f"blk.{i}.ffn_gate_exps.weight"))
                         for i in layers}

    def layout(self, layer: int) -> ExpertLayout:
        return self._layout

    def n_expert(self, layer: int) -> int:
        return self._n

    def expert_bytes(self, layer: int) -> int:
        return self._layout.expert_bytes

    def layer_range(self, layer: int) -> np.ndarray:
        n = self._n * self.expert_bytes(layer)
        at = self.layers.index(layer) * n
        return self.arena[at : at + n]

    def weights(self, layer: int):
        return self._weights[layer]


def _cache(store: ToyStore, slots: int, policy: str) -> ExpertSlotCache:
    cache = ExpertSlotCache(store, EmulatedDeviceArena(DeviceBudget(GIB)), slots, policy)  # type: ignore[arg-type]
    for region in cache.regions.values():
        MEMORY.register(region.memory, "device")
    return cache


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("n_expert,k,slots", [(512, 10, 150), (37, 3, 9)])
def test_a_cache_and_the_transliterated_device_taking_turns_choose_what_the_cache_alone_chooses(
        sd, policy: str, n_expert: int, k: int, slots: int) -> None:
    """tests/test_directory_handoff.py's walk with DeviceDirectories and the kernels in place of the twin: the
    same table for every pair, the same counters and bookkeeping, and the same bytes in every slot."""
    store = ToyStore((3, 5), n_expert)
    rng = np.random.default_rng(3)
    turns = []
    for _ in range(5):
        per_layer = [_batches(rng, n_expert, k, 20) for _ in store.layers]
        turns.append([(layer, ids) for step in zip(*per_layer) for layer, ids in zip(store.layers, step)])
    alone, taking_turns = _cache(store, slots, policy), _cache(store, slots, policy)
    device = sd.directories_for(taking_turns)
    assert device.period_of == {i: getattr(POLICIES[policy](slots, n_expert), "period", 1) for i in store.layers}
    buffers: dict[tuple[int, int], object] = {}
    for n, turn in enumerate(turns):
        for layer, ids in turn:
            want = alone.fetch_pair_addresses(store.weights(layer), ids, np.zeros((3, ids.size), dtype=np.uint64))
            if n % 2:
                taking_turns.hand_to_device(device)
                out = buffers.setdefault((layer, ids.shape[0]), device.pair_buffers(ids.shape[0], k))
                device.serve(layer, sd.cp.asarray(ids), out)
                got = np.array(out.table)
            else:
                got = taking_turns.fetch_pair_addresses(store.weights(layer), ids,
                                                        np.zeros((3, ids.size), dtype=np.uint64))
            base_w, base_g = alone.geometry(layer).slot0, taking_turns.geometry(layer).slot0
            assert (got - np.uint64(base_g)).tolist() == (want - np.uint64(base_w)).tolist()
    assert device.pushes == 2 and device.pulls == 2 and not taking_turns.on_device
    for layer in store.layers:
        assert alone.layer_counters()[layer] == taking_turns.layer_counters()[layer]
        a, b = alone.export_layer(layer), taking_turns.export_layer(layer)
        for name in ("slot_of", "expert_of", "last", "count"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert (a.clock, a.filled) == (b.clock, b.filled)
    for g, region in alone.regions.items():
        assert np.array_equal(region.memory, taking_turns.regions[g].memory)
    assert alone.total().evictions > 20


def test_the_launcher_passes_what_the_kernels_declare(sd) -> None:
    """The checks above only bind arguments that DeviceDirectories passes; this one says the binder refuses a
    wrong buffer type and a wrong scalar width, so the passing runs mean something."""
    ids = sd.cp.asarray(np.array([[1, 2]], dtype=np.int32))
    bad = (ids, np.int64(2), np.int32(2))  # n_pairs as int64: cupy would pack 8 bytes for a 4-byte int
    with pytest.raises(AssertionError, match="n_pairs"):
        _bind("directory_serve", bad + (None,) * 16)
    with pytest.raises(AssertionError, match="fills"):
        _bind("directory_fill", (sd.cp.zeros(4, dtype=np.int64), ids, None, np.int32(0)))
