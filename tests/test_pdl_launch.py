"""runner.backends.cuda.launch on the CPU: the sources of PDL_MODULES (every kernel waits before it touches memory),
the driver structures' layout against cuda.h, the arguments' marshalling, and when a kernel takes the PDL path.
The launches themselves run on the GPU box (tests/test_pdl_cuda.py)."""

from __future__ import annotations

import ctypes
import re
import struct

import numpy as np
import pytest

from runner.backends.cuda import launch
from runner.package_data import kernel_dir

# What may come before PDL_ENTRY() in a kernel: shared declarations, L2 prefetches of weights, and early_* reads of
# state the kernel right ahead never writes (pdl.cuh).
_BEFORE_ENTRY = re.compile(r"(__shared__\b[^;]*|(prefetch|early)_\w+(<\w+>)?\([^;]*\)|PDL_PREFETCH_L2\([^;]*\))")


def _kernel_bodies(source: str) -> list[tuple[str, str]]:
    """(name, body) of each __global__ function of a .cu source, macro line continuations joined."""
    source = source.replace("\\\n", "\n")
    found = []
    for m in re.finditer(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(", source):
        depth, i = 1, m.end()
        while depth:  # the parameter list
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            i += 1
        start = source.index("{", i) + 1
        depth, j = 1, start
        while depth:
            depth += {"{": 1, "}": -1}.get(source[j], 0)
            j += 1
        found.append((m.group(1), source[start:j - 1]))
    return found


@pytest.mark.parametrize("module", sorted(launch.PDL_MODULES))
def test_every_kernel_of_a_pdl_module_waits_before_it_touches_memory(module: str) -> None:
    kernels = _kernel_bodies((kernel_dir() / f"{module}.cu").read_text())
    assert kernels, f"no kernels found in cuda/{module}.cu"
    for name, body in kernels:
        code = re.sub(r"//[^\n]*", "", body)
        before, entry, _ = code.partition("PDL_ENTRY();")
        assert entry, f"cuda/{module}.cu: {name} has no PDL_ENTRY()"
        statements = [s.strip() for s in before.split(";") if s.strip()]
        for s in statements:
            assert _BEFORE_ENTRY.fullmatch(" ".join(s.split())), f"cuda/{module}.cu: {name} runs {s!r} before PDL_ENTRY()"


def test_the_parser_sees_a_kernel_that_reads_before_its_entry() -> None:
    """The check above fails where it should: a load ahead of the wait, or no wait at all."""
    source = """extern "C" __global__ void __launch_bounds__(64) late(const float* x, float* y) {
        __shared__ float s[64];
        const float v = x[threadIdx.x];
        PDL_ENTRY();
        y[threadIdx.x] = v;
    }
    extern "C" __global__ void none(float* y) { y[0] = 1.0f; }"""
    (late_name, late), (none_name, none) = _kernel_bodies(source)
    assert (late_name, none_name) == ("late", "none")
    before = [s.strip() for s in late.partition("PDL_ENTRY();")[0].split(";") if s.strip()]
    assert [bool(_BEFORE_ENTRY.fullmatch(" ".join(s.split()))) for s in before] == [True, False]
    assert "PDL_ENTRY();" not in none


def test_the_driver_structures_match_cuda_h() -> None:
    """CUlaunchAttribute: a 4-byte id, 4 of padding, a 64-byte union; CUlaunchConfig: 7 uints, then an 8-aligned
    stream, the attribute pointer and their count (x86-64 and aarch64 alike)."""
    assert ctypes.sizeof(launch._LaunchAttribute) == 72
    assert launch._LaunchAttribute.value.offset == 8
    cfg = launch._LaunchConfig
    assert (cfg.sharedMemBytes.offset, cfg.hStream.offset, cfg.attrs.offset, cfg.numAttrs.offset) == (24, 32, 40, 48)
    assert ctypes.sizeof(cfg) == 56


def test_a_launch_config_allows_programmatic_serialization() -> None:
    config = launch.launch_config((7, 3), (256,), 4096, 0xABC0)
    dims = (config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX, config.blockDimY, config.blockDimZ)
    assert dims == (7, 3, 1, 256, 1, 1)
    assert (config.sharedMemBytes, config.hStream, config.numAttrs) == (4096, 0xABC0, 1)
    assert config.attrs[0].id == 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    value = ctypes.string_at(ctypes.addressof(config.attrs.contents) + 8, 64)  # the union as the driver reads it
    assert struct.unpack_from("<i", value)[0] == 1 and value[4:] == bytes(60)
    assert launch.launch_config((1,), (32,), 0, 0).hStream is None  # the legacy default stream


class _Pointer:
    def __init__(self, ptr: int):
        self.ptr = ptr


class _DeviceArray:  # what kernel_params reads of a CuPy array
    def __init__(self, ptr: int):
        self.data = _Pointer(ptr)


def test_arguments_marshal_as_cupy_passes_them() -> None:
    args = (_DeviceArray(0x7F0000001000), np.int32(-5), np.int64(1 << 40), np.float32(0.5), np.float64(1e-6),
            np.uint64(0))
    buffers, params = launch.kernel_params(args)
    values = [ctypes.string_at(params[i], size) for i, size in enumerate((8, 4, 8, 4, 8, 8))]
    assert struct.unpack("<Q", values[0])[0] == 0x7F0000001000
    assert struct.unpack("<i", values[1])[0] == -5
    assert struct.unpack("<q", values[2])[0] == 1 << 40
    assert struct.unpack("<f", values[3])[0] == 0.5
    assert struct.unpack("<d", values[4])[0] == 1e-6
    assert struct.unpack("<Q", values[5])[0] == 0
    assert len(buffers) == 6


@pytest.mark.parametrize("arg", [3, 2.5, None, np.zeros(3, dtype=np.float32)])
def test_an_argument_without_a_fixed_type_goes_through_cupy(arg) -> None:
    """A Python scalar's type is CuPy's to choose and a host array is no device pointer: such a launch is CuPy's."""
    assert launch.kernel_params((_DeviceArray(16), arg)) is None


class _Raw:
    """A RawKernel's call and attributes, recorded."""

    def __init__(self):
        self.calls = []
        self.max_dynamic_shared_size_bytes = 0
        self.name = "k"

    def __call__(self, grid, block, args, shared_mem=0):
        self.calls.append((grid, block, args, shared_mem))


@pytest.mark.parametrize("pdl,module,via_pdl", [(False, "gemv", False), (True, "gemv", True),
                                                (True, "moe_prefill", False)])
def test_a_kernel_takes_the_pdl_path_only_when_on_and_its_module_waits(monkeypatch, pdl: bool, module: str,
                                                                       via_pdl: bool) -> None:
    monkeypatch.setattr(launch, "PDL", pdl)
    seen = []
    monkeypatch.setattr(launch, "launch", lambda raw, *a: seen.append(a))
    raw = _Raw()
    kernel = launch.Module(type("M", (), {"get_function": lambda self, n: raw})(), module).get_function("k")
    kernel((2,), (64,), (np.int32(1),), shared_mem=128)
    assert (seen, raw.calls) == (([((2,), (64,), (np.int32(1),), 128)], []) if via_pdl else
                                 ([], [((2,), (64,), (np.int32(1),), 128)]))
    kernel.max_dynamic_shared_size_bytes = 99 * 1024  # attributes are the RawKernel's
    assert raw.max_dynamic_shared_size_bytes == 99 * 1024 and kernel.name == "k"
