"""cuda/copy_runs.cu on the CPU: a transliteration of copy_run's index math, launched through the real launcher
(runner/backends/cuda/copy_runs.py, loaded over a stand-in for CuPy), held to exact coverage.

Every thread of every block of the launch's grid is simulated (vectorized: each thread's strided words), with
the word width the launcher picks. Checked per launch: the arguments have the numpy types of the kernel's C
parameters (pointers 8 bytes, the offset tables int64 arrays for `const long long*`, `words` an np.int64 for
`long long`); the grid and block are within CUDA's limits; every word a thread touches is aligned to its width
on both sides and inside the run's bytes; the threads of a run cover its words exactly once; a destination byte
is written by one run only and bytes outside the runs are untouched; the copied bytes equal the source's. Byte
offsets past 4 GiB (the 45 GB host store's scale) are checked in the address space without backing memory.

The kernel's lines the transliteration follows are pinned by text (KERNEL_LINES): an edit of them fails here
until the transliteration is revisited. What this cannot show: timing, real memory ordering between streams
(copy_experts' event waits), and NVRTC's view of the source; the GPU test is test_offload_cuda's copy test.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "cuda" / "copy_runs.cu"

# The lines of copy_run the simulation below transliterates (whitespace-insensitive).
KERNEL_LINES = (
    "const Word* s = src + src_off[blockIdx.y];",
    "Word* d = dst + dst_off[blockIdx.y];",
    "for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < words; "
    "i += (long long)gridDim.x * blockDim.x)",
    "d[i] = s[i];",
)
WORD_TYPES = {"uint4": 16, "unsigned int": 4, "unsigned char": 1}


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _kernels() -> dict[str, list[tuple[str, bool]]]:
    """name -> (C type, is pointer) of each parameter, for each extern "C" kernel of copy_runs.cu."""
    source = SOURCE.read_text()
    out = {}
    for m in re.finditer(r'extern "C" __global__ void\s+(\w+)\s*\(([^)]*)\)', source, re.DOTALL):
        params = []
        for p in m.group(2).split(","):
            p = re.sub(r"\b(const|__restrict__)\b", " ", p)
            pm = re.fullmatch(r"\s*([\w ]+?)\s*(\*?)\s*(\w+)\s*", p)
            assert pm, p
            params.append((pm.group(1).strip(), bool(pm.group(2))))
        out[m.group(1)] = params
    return out


def test_the_transliterated_lines_are_the_kernels() -> None:
    source = _squash(SOURCE.read_text())
    for line in KERNEL_LINES:
        assert _squash(line) in source, f"copy_runs.cu no longer has `{line}`: revisit the transliteration"
    kernels = _kernels()
    assert set(kernels) == {"copy_runs_16", "copy_runs_4", "copy_runs_1"}
    for name, params in kernels.items():
        word = params[0][0]
        assert WORD_TYPES[word] == int(name.rsplit("_", 1)[1]), f"{name} copies {word}"
        assert params == [(word, True), (word, True), ("long long", True), ("long long", True), ("long long", False)]


# -- the launcher over a CuPy stand-in ------------------------------------------------------------------
class Device:
    """The address space the simulated launch sees: named buffers at chosen (possibly huge) addresses."""

    def __init__(self) -> None:
        self.buffers: list[tuple[int, int, np.ndarray | None, str]] = []  # start, size, bytes or None, name
        self.launches: list[dict] = []

    def add(self, name: str, address: int, size: int, backed: bool) -> np.ndarray | None:
        data = (np.arange(size, dtype=np.int64) * 7 % 251 + 1).astype(np.uint8) if backed else None
        self.buffers.append((address, size, data, name))
        return data

    def find(self, address: int) -> tuple[int, int, np.ndarray | None, str]:
        hits = [b for b in self.buffers if b[0] <= address < b[0] + b[1]]
        assert len(hits) == 1, f"address {address:#x} is in no buffer"
        return hits[0]


DEVICE = Device()


class Launch:
    def __init__(self, name: str):
        self.name = name

    def __call__(self, grid, block, args) -> None:
        params = _kernels()[self.name]
        assert len(args) == len(params)
        for (ctype, pointer), a in zip(params, args):
            if pointer and ctype == "long long":
                assert isinstance(a, np.ndarray) and a.dtype == np.int64 and a.ndim == 1, (self.name, ctype, a)
            elif pointer:
                assert type(a) in (np.uint64, np.int64), f"{self.name}: {type(a).__name__} for a {ctype}*"
            else:
                assert type(a) is np.int64, f"{self.name}: {type(a).__name__} passed for a {ctype}"
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        assert 1 <= grid[0] < 2**31 and 1 <= grid[1] <= 65535 and grid[2] == 1, grid
        assert 1 <= block[0] <= 1024 and block[1] == block[2] == 1, block
        DEVICE.launches.append(dict(name=self.name, grid=grid, block=block, args=args))


def _stub_cupy() -> ModuleType:
    cp = ModuleType("cupy")
    cp.asarray = lambda a, dtype=None: np.array(a, dtype=dtype)  # a device copy of the table
    cp.cuda = SimpleNamespace()
    return cp


@pytest.fixture(scope="module")
def copy_runs_module():
    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = _stub_cupy()
    try:
        spec = importlib.util.spec_from_file_location("copy_runs_on_cpu", ROOT / "runner/backends/cuda/copy_runs.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved
    module.load_module = lambda name, defines=(): SimpleNamespace(get_function=Launch)
    return module


@pytest.fixture(autouse=True)
def _fresh_device():
    DEVICE.buffers.clear()
    DEVICE.launches.clear()
    yield


# -- the kernel, transliterated -----------------------------------------------------------------------------
def simulate(launch: dict) -> None:
    """Run the launch's every thread: copy where the buffers are backed, and check alignment, bounds and
    exact coverage of each run's words by the grid-stride loop."""
    w = int(launch["name"].rsplit("_", 1)[1])
    src, dst, src_off, dst_off, words = launch["args"]
    src, dst, words = int(src), int(dst), int(words)
    (gx, gy, _), (bx, _, _) = launch["grid"], launch["block"]
    assert gy == src_off.size == dst_off.size
    # threads of one blockIdx.y row: start = blockIdx.x * blockDim.x + threadIdx.x, stride gridDim.x * blockDim.x
    start = (np.arange(gx, dtype=np.int64)[:, None] * bx + np.arange(bx, dtype=np.int64)[None, :]).reshape(-1)
    stride = gx * bx
    passes = max(0, -(-(words - int(start.min())) // stride))
    i = start[:, None] + stride * np.arange(passes, dtype=np.int64)[None, :]
    taken = i[i < words]  # every (thread, pass) whose i < words runs the body once
    counts = np.bincount(taken, minlength=words) if words else np.zeros(0, np.int64)
    assert counts.size == words and (counts == 1).all(), "words copied not exactly once"
    for y in range(gy):  # blockIdx.y: s = src + src_off[y], d = dst + dst_off[y] (Word* arithmetic)
        s_addr, d_addr = src + int(src_off[y]) * w, dst + int(dst_off[y]) * w
        assert s_addr % w == 0 and d_addr % w == 0, f"run {y}: {w}-byte words misaligned"
        for addr, writes in ((s_addr, False), (d_addr, True)):
            start_b, size, data, name = DEVICE.find(addr)
            assert addr + words * w <= start_b + size, f"run {y} overruns {name}"
        if words == 0:
            continue
        s_start, _, s_data, _ = DEVICE.find(s_addr)
        d_start, _, d_data, _ = DEVICE.find(d_addr)
        if s_data is not None and d_data is not None:
            sb, db = s_addr - s_start, d_addr - d_start
            # d[i] = s[i] for the words `taken`, word by word as bytes
            byte_idx = (taken[:, None] * w + np.arange(w)[None, :]).reshape(-1)
            d_data[db + byte_idx] = s_data[sb + byte_idx]


def run_case(mod, nbytes: int, dst_base: int, dst_offsets: list[int], src_base: int, src_offsets: list[int],
             backed: bool = True, dst_size: int | None = None, src_size: int | None = None) -> None:
    dst_size = dst_size or max(dst_offsets) + nbytes
    src_size = src_size or max(src_offsets) + nbytes
    dst = DEVICE.add("dst", dst_base, dst_size, backed)
    src = DEVICE.add("src", src_base, src_size, backed)
    if backed:
        dst[:] = 0
        before_src = src.copy()
    mod.copy_runs(dst_base, dst_offsets, src_base, src_offsets, nbytes)
    assert len(DEVICE.launches) == 1
    launch = DEVICE.launches[-1]
    w = int(launch["name"].rsplit("_", 1)[1])
    # the widest word that every base, offset and the length allow
    want = next(v for v in (16, 4, 1) if all(x % v == 0 for x in (dst_base, src_base, nbytes, *dst_offsets, *src_offsets)))
    assert w == want and int(launch["args"][4]) * w == nbytes
    simulate(launch)
    if not backed:
        return
    expect = np.zeros(dst_size, np.uint8)
    for d, s in zip(dst_offsets, src_offsets):
        expect[d : d + nbytes] = before_src[s : s + nbytes]
    assert np.array_equal(dst, expect), "a run's bytes differ, or bytes outside the runs were written"
    assert np.array_equal(src, before_src)


NBYTES = [1, 3, 4, 15, 16, 17, 20, 64, 4095, 4096, 4097, 210 * 3, 1000, 1050, 256 * 16 * 64, 256 * 16 * 64 + 16,
          256 * 16 * 64 * 3 + 48, 256 * 4 * 64 + 4, 256 * 64 + 1]


@pytest.mark.parametrize("nbytes", NBYTES)
@pytest.mark.parametrize("misalign", [(0, 0), (4, 0), (0, 8), (1, 0), (16, 32), (12, 4)])
def test_runs_are_copied_exactly_once_in_aligned_words(copy_runs_module, nbytes: int, misalign) -> None:
    """Expert e of a staging buffer into slot s of the cache, non-contiguous and out of order, gaps between
    the slots that must stay zero; bases moved off 256-byte alignment where asked."""
    dm, sm = misalign
    rng = np.random.default_rng(nbytes)
    n_src, n_runs = 7, 4
    src_offsets = [int(e) * nbytes for e in rng.permutation(n_src)[:n_runs]]
    gap = 16
    dst_offsets = [int(s) * (nbytes + gap) for s in rng.permutation(n_runs + 2)[:n_runs]]
    run_case(copy_runs_module, nbytes, 0x7F00_0000_0000 + dm, dst_offsets, 0x7E00_0000_0000 + sm, src_offsets,
             src_size=n_src * nbytes, dst_size=(n_runs + 2) * (nbytes + gap))


def test_a_layers_warm_set_of_150_runs(copy_runs_module) -> None:
    """The seed48 shape: 150 warm experts of a 2 MB-ish expert into slots at the cache's layer base."""
    eb = 2 * 1024 * 1024 + 3 * 1024 * 16
    rng = np.random.default_rng(0)
    src = [int(e) * eb for e in rng.permutation(160)[:150]]
    base = 5 * 150 * eb  # the layer's slots after five layers of the same size
    dst = [base + int(s) * eb for s in rng.permutation(150)]
    run_case(copy_runs_module, eb, 0x7F00_0000_0000, dst, 0x7E00_0000_0000, src, backed=False,
             dst_size=base + 150 * eb, src_size=160 * eb)


def test_byte_offsets_past_4_gib_are_not_truncated(copy_runs_module) -> None:
    """Slots of the 40th layer of a 45 GB cache, staging offsets past 2^32 bytes: offsets go as int64 words
    and the kernel adds them as long long; the addresses the threads reach are the exact byte addresses."""
    eb = 3 * 2**20 + 16 * 13
    base = 40 * 150 * eb  # about 19 GB
    assert base > 2**34
    dst = [base + s * eb for s in (149, 0, 77)]
    src = [(2**32 // eb + e) * eb for e in (5, 1, 300)]
    run_case(copy_runs_module, eb, 0x7F00_0000_0000, dst, 0x7A00_0000_0000, src, backed=False,
             dst_size=base + 150 * eb, src_size=2**32 + 400 * eb)
    launch = DEVICE.launches[-1]
    w = int(launch["name"].rsplit("_", 1)[1])
    assert [int(v) * w for v in launch["args"][3]] == dst and [int(v) * w for v in launch["args"][2]] == src


def test_no_runs_launch_nothing(copy_runs_module) -> None:
    copy_runs_module.copy_runs(0x7F00_0000_0000, [], 0x7E00_0000_0000, [], 4096)
    assert DEVICE.launches == []
