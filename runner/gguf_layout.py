"""Read a GGUF file's header, metadata and tensor table as untrusted bytes.

Every count, length and offset is checked against the bytes the file has before it is used, so a
hostile file fails with one ModelFileError naming what is wrong, in time and memory bounded by the
file's own size. (gguf.GGUFReader trusts the counts: a huge one loops while memory grows, and it
builds a numpy object per array item, seconds and hundreds of MB for a 150k-token vocabulary.)
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from runner.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32

# Fixed-size scalar types: struct format (little-endian) and numpy dtype for arrays of them.
_SCALARS: dict[GGUFValueType, tuple[struct.Struct, np.dtype]] = {
    GGUFValueType.UINT8: (struct.Struct("<B"), np.dtype("<u1")),
    GGUFValueType.INT8: (struct.Struct("<b"), np.dtype("<i1")),
    GGUFValueType.UINT16: (struct.Struct("<H"), np.dtype("<u2")),
    GGUFValueType.INT16: (struct.Struct("<h"), np.dtype("<i2")),
    GGUFValueType.UINT32: (struct.Struct("<I"), np.dtype("<u4")),
    GGUFValueType.INT32: (struct.Struct("<i"), np.dtype("<i4")),
    GGUFValueType.FLOAT32: (struct.Struct("<f"), np.dtype("<f4")),
    GGUFValueType.BOOL: (struct.Struct("<?"), np.dtype("?")),
    GGUFValueType.UINT64: (struct.Struct("<Q"), np.dtype("<u8")),
    GGUFValueType.INT64: (struct.Struct("<q"), np.dtype("<i8")),
    GGUFValueType.FLOAT64: (struct.Struct("<d"), np.dtype("<f8")),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_STRING_MIN = 8  # a string is at least its u64 length
_KV_MIN = 8 + 4 + 1  # key length, value type, the smallest value
_TENSOR_INFO_MIN = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset


@dataclass(frozen=True, slots=True)
class ValueType:
    """A metadata value's GGUF type; `item` is the element type of an array."""

    type: GGUFValueType
    item: GGUFValueType | None = None

    def __str__(self) -> str:
        return f"array of {self.item.name}" if self.item is not None else self.type.name


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One row of the tensor table, checked: a known type, whole blocks per row, data inside the file."""

    name: str
    qtype: GGMLQuantizationType
    ne: tuple[int, ...]  # ggml order: row length first
    offset: int  # absolute, in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFLayout:
    version: int
    alignment: int
    # int, float, bool or str; an array of strings as a list, any other array as a read-only numpy view
    metadata: dict[str, Any]
    value_types: dict[str, ValueType]
    tensors: list[TensorEntry]
    data_offset: int


def read_layout(buf: mmap.mmap, name: str) -> GGUFLayout:
    """Parse and check the header, metadata and tensor table in `buf` (the whole file mapped); `name` starts
    messages. Arrays of numbers stay views of `buf`."""
    return _Parser(buf, name).layout()


class _Parser:
    def __init__(self, buf: mmap.mmap, name: str):
        self.buf = buf
        self.name = name
        self.size = len(buf)
        self.pos = 0

    def fail(self, message: str) -> ModelFileError:
        return ModelFileError(f"{self.name}: {message}")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(
                f"truncated or corrupt: {what} needs {n} bytes at offset {self.pos}, but the file has {self.size}"
            )

    def u32(self, what: str) -> int:
        self.need(4, what)
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def u64(self, what: str) -> int:
        self.need(8, what)
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return value

    def raw_string(self, what: str) -> bytes:
        n = self.u64(what)
        self.need(n, what)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw

    def string(self, what: str) -> str:
        start = self.pos
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not valid UTF-8 (byte {exc.start} of the string at offset {start})") from None

    def strings(self, count: int, what: str) -> list[str]:
        """An array's strings: the loop a vocabulary's 150k-300k tokens and merges go through, so it checks
        only what it must; the item that fails is read again by string() for the message."""
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        out: list[str] = []
        append = out.append
        start = pos
        try:
            for _ in range(count):
                start = pos
                end = pos + 8 + unpack(buf, pos)[0]
                if end > size:
                    break
                append(buf[pos + 8 : end].decode("utf-8"))
                pos = end
            else:
                self.pos = pos
                return out
        except (struct.error, UnicodeDecodeError):
            pass
        self.pos = start
        self.string(f"{what} item {len(out)}")
        raise AssertionError("unreachable: string() refuses the item the fast loop could not read")

    def value_type(self, what: str) -> GGUFValueType:
        raw = self.u32(what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self.fail(f"{what} has unknown value type id {raw}") from None

    # -- the sections ---------------------------------------------------------------------------

    def layout(self) -> GGUFLayout:
        self.need(4, "the magic")
        magic = self.buf[:4]
        if magic != GGUF_MAGIC:
            raise self.fail(f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        self.pos = 4
        version = self.u32("the version")
        if version not in SUPPORTED_VERSIONS:
            byte_swapped = version > 0xFFFF and version & 0xFFFF == 0
            raise self.fail(
                "big-endian GGUF files are not supported" if byte_swapped
                else f"GGUF version {version} is not supported (supported: {', '.join(map(str, SUPPORTED_VERSIONS))})"
            )
        n_tensors = self.u64("the tensor count")
        n_kv = self.u64("the metadata count")
        self.count_fits(n_kv, _KV_MIN, "the header's metadata count")
        metadata: dict[str, Any] = {}
        types: dict[str, ValueType] = {}
        for index in range(n_kv):
            key = self.string(f"metadata key #{index}")
            if key in metadata:
                raise self.fail(f"metadata key '{key}' appears twice")
            metadata[key], types[key] = self.value(f"metadata key '{key}'")
        alignment = _alignment(metadata, types, self.fail)
        self.count_fits(n_tensors, _TENSOR_INFO_MIN, "the header's tensor count")
        infos = [self.tensor_info(index) for index in range(n_tensors)]
        data_offset = -(-self.pos // alignment) * alignment
        tensors = self.tensors(infos, data_offset, alignment)
        return GGUFLayout(version, alignment, metadata, types, tensors, data_offset)

    def count_fits(self, count: int, item_min: int, what: str) -> None:
        if count * item_min > self.size - self.pos:
            raise self.fail(
                f"truncated or corrupt: {what} is {count}, at least {count * item_min} bytes, "
                f"but {self.size - self.pos} bytes remain after offset {self.pos}"
            )

    def value(self, what: str) -> tuple[Any, ValueType]:
        vtype = self.value_type(what)
        if vtype == GGUFValueType.STRING:
            return self.string(what), ValueType(vtype)
        if vtype != GGUFValueType.ARRAY:
            return self.scalar(vtype, what), ValueType(vtype)
        item = self.value_type(f"the item type of {what}")
        count = self.u64(f"the array length of {what}")
        if item == GGUFValueType.ARRAY:
            raise self.fail(f"{what} is an array of arrays, which GGUF readers (llama.cpp) do not support")
        if item == GGUFValueType.STRING:
            self.count_fits(count, _STRING_MIN, f"the array length of {what}")
            return self.strings(count, what), ValueType(vtype, item)
        dtype = _SCALARS[item][1]
        self.count_fits(count, dtype.itemsize, f"the array length of {what}")
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)  # a view: no copy
        self.pos += count * dtype.itemsize
        return values, ValueType(vtype, item)

    def scalar(self, vtype: GGUFValueType, what: str) -> Any:
        fmt = _SCALARS[vtype][0]
        self.need(fmt.size, what)
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return value

    def tensor_info(self, index: int) -> tuple[str, tuple[int, ...], int, int]:
        name = self.string(f"the name of tensor #{index}")
        n_dims = self.u32(f"the dimension count of tensor '{name}'")
        if not 1 <= n_dims <= MAX_DIMS:
            raise self.fail(f"tensor '{name}' has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        ne = tuple(self.u64(f"the dimensions of tensor '{name}'") for _ in range(n_dims))
        type_id = self.u32(f"the type of tensor '{name}'")
        offset = self.u64(f"the data offset of tensor '{name}'")
        return name, ne, type_id, offset

    def tensors(self, infos: list[tuple[str, tuple[int, ...], int, int]], data_offset: int,
                alignment: int) -> list[TensorEntry]:
        out: list[TensorEntry] = []
        seen: set[str] = set()
        for name, ne, type_id, offset in infos:
            if name in seen:
                raise self.fail(f"tensor '{name}' appears twice")
            seen.add(name)
            try:
                qtype = GGMLQuantizationType(type_id)
            except ValueError:
                raise self.fail(f"tensor '{name}' has unknown tensor type id {type_id}") from None
            block, type_size = GGML_QUANT_SIZES[qtype]
            if min(ne) < 1:
                raise self.fail(f"tensor '{name}' has an empty dimension: {list(ne)}")
            if ne[0] % block:
                raise self.fail(
                    f"tensor '{name}' has rows of {ne[0]}, not a multiple of {qtype.name}'s block of {block}"
                )
            nbytes = math.prod(ne) // block * type_size
            if offset % alignment:
                raise self.fail(
                    f"tensor '{name}' has data offset {offset}, not a multiple of the alignment {alignment}"
                )
            start = data_offset + offset
            if start + nbytes > self.size:
                raise self.fail(
                    f"truncated: tensor '{name}' needs bytes up to {start + nbytes} but the file has {self.size}"
                )
            out.append(TensorEntry(name, qtype, ne, start, nbytes))
        return out


def _alignment(metadata: dict[str, Any], types: dict[str, ValueType], fail: Any) -> int:
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    value, vtype = metadata["general.alignment"], types["general.alignment"]
    if vtype != ValueType(GGUFValueType.UINT32) or value < 1 or value & (value - 1):
        raise fail(f"metadata key 'general.alignment' must be a UINT32 power of two, found {vtype} {value!r}")
    return value
