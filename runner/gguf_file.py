"""Open and validate a GGUF file through the `gguf` package: typed metadata and memory-mapped tensor views."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import _type_traits as _dequantizable

from runner.errors import ModelFileError

GGUF_MAGIC = b"GGUF"

# Types the numpy reference can turn into float32: the two native float types plus every
# quant type `gguf.quants` registers a dequantizer for.
REFERENCE_QTYPES: frozenset[GGMLQuantizationType] = frozenset(
    {GGMLQuantizationType.F32, GGMLQuantizationType.F16, *_dequantizable}
)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: its logical shape in numpy order and a raw memory-mapped view."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: (..., rows, row_length); ggml's ne reversed
    data: np.ndarray  # raw view into the file: float arrays for F32/F16, uint8 blocks otherwise
    offset: int

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def row_length(self) -> int:
        return self.shape[-1]


class GGUFFile:
    """A validated GGUF file: metadata as Python values and tensors as views (nothing read eagerly)."""

    def __init__(self, path: Path, reader: GGUFReader):
        self.path = path
        self._reader = reader
        self.metadata: dict[str, Any] = {f.name: _field_value(f) for f in reader.fields.values()}
        self.tensors: dict[str, TensorInfo] = {
            t.name: TensorInfo(
                name=t.name,
                qtype=t.tensor_type,
                shape=tuple(int(d) for d in reversed(t.shape.tolist())),
                data=t.data,
                offset=int(t.data_offset),
            )
            for t in reader.tensors
        }

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise ModelFileError(f"{self.path.name}: metadata key '{key}' is missing")
        return self.metadata[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def tensor(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise ModelFileError(f"{self.path.name}: required tensor '{name}' is missing")
        return info

    def has_tensor(self, name: str) -> bool:
        return name in self.tensors


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open `path` as a GGUF file, raising ModelFileError with one line for anything wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    size = path.stat().st_size
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path.name}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        reader = GGUFReader(path, "r")
    except ValueError as exc:
        if "GGMLQuantizationType" in str(exc):
            raise ModelFileError(f"{path.name}: unknown tensor type id ({exc})") from None
        raise ModelFileError(f"{path.name}: truncated or corrupt GGUF ({size} bytes on disk): {exc}") from None
    except (IndexError, KeyError, OverflowError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{path.name}: truncated or corrupt GGUF ({size} bytes on disk): {exc}") from None
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise ModelFileError(
                f"{path.name}: truncated: tensor '{t.name}' needs bytes up to {end} but the file has {size}"
            )
    return GGUFFile(path, reader)


def check_reference_qtype(info: TensorInfo) -> None:
    """Refuse a tensor whose quant type the reference path cannot dequantize."""
    if info.qtype not in REFERENCE_QTYPES:
        names = ", ".join(sorted(t.name for t in REFERENCE_QTYPES))
        raise ModelFileError(f"tensor '{info.name}' has unsupported quant type {info.qtype.name}; supported: {names}")


def _field_value(field: Any) -> Any:
    """A metadata field as a plain Python value (str, int, float, bool or list of them)."""
    main = field.types[0]
    if main == GGUFValueType.ARRAY:
        return field.contents()
    value = field.contents()
    if main == GGUFValueType.BOOL:
        return bool(value)
    return value
