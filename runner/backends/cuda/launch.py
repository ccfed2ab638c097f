"""Kernel launches with programmatic dependent launch (PDL, sm_90+): the next kernel of a stream starts its blocks
while the one before still runs, instead of after it ends.

A decode token is a chain of about 480 small kernels (resident seed48 on an H100: 4.88 ms, about 10 us a node,
against 0.4 ms of weight bytes at HBM speed), so each kernel's launch and ramp-up sit on the critical path. With
PDL the next kernel's blocks are resident when the last one ends, and a product's blocks ask L2 for their weights
meanwhile (cuda/pdl.cuh). CuPy launches without launch attributes, so a PDL launch goes through the driver's
cuLaunchKernelEx; stream capture keeps the attribute as a programmatic edge of the graph.

Only kernels of PDL_MODULES launch this way, and every kernel there begins with PDL_ENTRY() (checked on the CPU
by tests/test_pdl_launch.py): a kernel that did not wait could read its inputs before they are written.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

# The bits are the same either way: the same kernels read the same bytes. On an H100
# (docs/perf/2026-12-07h-seed48-pdl-split-ahead-h100.md): resident seed48 5.05 -> 4.70 ms of GPU a token, offloaded
# 7.26 -> 7.12 (7.29 -> 7.12 in a second call).
PDL = True
# The modules whose every kernel starts with PDL_ENTRY(): the decode token's kernels.
PDL_MODULES = frozenset({"gemv", "norm_rope", "route", "attention", "greedy", "slot_directory"})

_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: id, 4 bytes of padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


@dataclass
class LaunchCounts:
    """Launches since the process started: through cuLaunchKernelEx with PDL, and plain ones of PDL_MODULES'
    kernels whose arguments the marshalling does not take (a Python scalar: CuPy's own rules decide its type)."""
    pdl: int = 0
    plain: int = 0


counts = LaunchCounts()


def kernel_params(args: Sequence[Any]) -> tuple[list[Any], Any] | None:
    """(the buffers to keep alive, the void*[] of cuLaunchKernelEx's kernelParams) for `args` as CuPy's RawKernel
    passes them: an array (anything with `.data.ptr`) as its device pointer, a NumPy scalar as its bytes. None
    when an argument is neither (the caller launches through CuPy instead)."""
    buffers: list[Any] = []
    for a in args:
        if isinstance(a, np.generic):
            buffers.append(ctypes.create_string_buffer(a.tobytes(), a.itemsize))
        elif hasattr(a, "data") and hasattr(a.data, "ptr"):
            buffers.append(ctypes.c_void_p(int(a.data.ptr)))
        else:
            return None
    params = (ctypes.c_void_p * max(len(buffers), 1))(*(ctypes.addressof(b) for b in buffers))
    return buffers, params


# Every PDL launch's one attribute, made once (the driver reads it during the call only).
_ALLOWED = (_LaunchAttribute * 1)()
_ALLOWED[0].id = _ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_ALLOWED[0].value = struct.pack("<i", 1).ljust(64, b"\0")  # programmaticStreamSerializationAllowed


def launch_config(grid: Sequence[int], block: Sequence[int], shared_mem: int, stream: int) -> Any:
    """The CUlaunchConfig of a launch with programmatic stream serialization allowed."""
    grid, block = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
    return _LaunchConfig(*grid, *block, shared_mem, ctypes.c_void_p(stream or None), _ALLOWED, 1)


@lru_cache(maxsize=1)
def _driver() -> Any:
    lib = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
    launch = lib.cuLaunchKernelEx
    launch.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    launch.restype = ctypes.c_int
    return launch


def launch(kernel: Any, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], shared_mem: int = 0) -> None:
    """`kernel` (a CuPy RawKernel of a PDL_MODULES module) on CuPy's current stream with PDL allowed, or through
    CuPy as usual when an argument is not one kernel_params takes."""
    marshalled = kernel_params(args)
    if marshalled is None:
        counts.plain += 1
        kernel(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)
        return
    import cupy as cp

    config = launch_config(grid, block, shared_mem, cp.cuda.get_current_stream().ptr)
    _buffers, params = marshalled
    status = _driver()(ctypes.byref(config), ctypes.c_void_p(int(kernel.kernel.ptr)), params, None)
    if status != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed for {kernel.name}: CUresult {status}")
    counts.pdl += 1


class Kernel:
    """A RawKernel of `module` that launches with PDL when `PDL` is on and the module is in PDL_MODULES; its
    other attributes (max_dynamic_shared_size_bytes, name, ...) are the RawKernel's."""

    __slots__ = ("raw", "pdl_ready")

    def __init__(self, raw: Any, module: str):
        object.__setattr__(self, "raw", raw)
        object.__setattr__(self, "pdl_ready", module in PDL_MODULES)

    def __call__(self, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], shared_mem: int = 0) -> None:
        if PDL and self.pdl_ready:
            launch(self.raw, grid, block, args, shared_mem)
        else:
            self.raw(grid, block, args, shared_mem=shared_mem)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.raw, name, value)


class Module:
    """A compiled RawModule whose get_function gives Kernels; everything else is the RawModule's."""

    def __init__(self, raw: Any, name: str):
        self.raw, self.name = raw, name

    def get_function(self, name: str) -> Kernel:
        return Kernel(self.raw.get_function(name), self.name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)
