"""Copy a GGUF file with edits, to make the broken files the loader must refuse: typed metadata edits,
tensor edits, and the byte offsets of each section, key and tensor record for raw patches."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np
from gguf import GGUFReader, GGUFValueType

# A tensor edit gets (name, qtype, raw data) and returns the same triple changed, None to drop it, or a
# list of triples to write several tensors in its place.
Triple = "tuple[str, gguf.GGMLQuantizationType, np.ndarray]"
TensorEdit = Callable[[str, gguf.GGMLQuantizationType, np.ndarray], f"{Triple} | list[{Triple}] | None"]

DROP = object()  # a metadata value that removes the key


@dataclass(frozen=True)
class Typed:
    """A metadata value written with an explicit GGUF type (`item`: an array's element type); a str value
    may be bytes, to write a string that is not UTF-8."""

    value: Any
    type: GGUFValueType
    item: GGUFValueType | None = None


def rewrite_gguf(src: Path, dst: Path, metadata: dict[str, Any] | None = None,
                 tensor_edit: TensorEdit | None = None) -> Path:
    """Copy `src` to `dst`: `metadata` replaces or adds keys (a str is a STRING, an int a UINT32, a Typed
    as given, DROP removes the key), `tensor_edit` changes or drops tensors."""
    edits = dict(metadata or {})
    reader = GGUFReader(src)
    arch = edits.pop("general.architecture", None) or reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch if isinstance(arch, str) else "")
    if not isinstance(arch, str):  # a Typed value, or DROP
        w.kv_data[0].pop("general.architecture", None)
        _add(w, "general.architecture", arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        if field.name in edits:
            _add(w, field.name, edits.pop(field.name))
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub)
    for key, value in edits.items():
        _add(w, key, value)
    for t in reader.tensors:
        item = (t.name, t.tensor_type, np.array(t.data))
        if tensor_edit is not None:
            item = tensor_edit(*item)
        for name, qtype, data in [] if item is None else item if isinstance(item, list) else [item]:
            w.add_tensor(name, data, raw_dtype=qtype if data.dtype == np.uint8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _add(w: gguf.GGUFWriter, key: str, value: Any) -> None:
    if value is DROP:
        return
    if isinstance(value, Typed):
        w.add_key_value(key, value.value, value.type, value.item)
    else:
        w.add_key_value(key, value, GGUFValueType.STRING if isinstance(value, str) else GGUFValueType.UINT32)


@dataclass(frozen=True)
class Layout:
    """Where things are in a valid GGUF file, for raw patches: section starts, each key's value and each
    tensor record's fields (byte offsets from the start of the file)."""

    size: int
    kv_start: int  # after magic, version, tensor count, metadata count
    tensor_info_start: int
    data_start: int
    values: dict[str, int]  # key -> offset of its value (an array's item type, a string's u64 length)
    tensor_records: dict[str, dict[str, int]]  # name -> {"n_dims", "dims", "type", "offset"}


def layout_of(path: Path) -> Layout:
    reader = GGUFReader(path)
    values: dict[str, int] = {}
    for field in reader.fields.values():
        if not field.name.startswith("GGUF."):
            values[field.name] = field.offset + 8 + len(field.name.encode()) + 4
    records: dict[str, dict[str, int]] = {}
    for t in reader.tensors:
        start = t.field.offset + 8 + len(t.name.encode())
        n_dims = len(t.shape)
        records[t.name] = {"n_dims": start, "dims": start + 4, "type": start + 4 + 8 * n_dims,
                           "offset": start + 8 + 8 * n_dims}
    tensor_info_start = min(t.field.offset for t in reader.tensors)
    return Layout(Path(path).stat().st_size, 24, tensor_info_start, int(reader.data_offset), values, records)


def patched(src: Path, dst: Path, *patches: tuple[int, bytes]) -> Path:
    """A copy of `src` with bytes overwritten at the given offsets."""
    data = bytearray(Path(src).read_bytes())
    for offset, new in patches:
        data[offset : offset + len(new)] = new
    Path(dst).write_bytes(bytes(data))
    return dst


def u32(value: int) -> bytes:
    return struct.pack("<I", value)


def u64(value: int) -> bytes:
    return struct.pack("<Q", value)
