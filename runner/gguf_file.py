"""Open and validate a GGUF file: typed metadata and memory-mapped tensor views."""

from __future__ import annotations

import math
import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType
from gguf.quants import _type_traits as _dequantizable
from gguf.quants import quant_shape_to_byte_shape

from runner.errors import ModelFileError
from runner.gguf_layout import GGUF_MAGIC, GGUFLayout, TensorEntry, ValueType, read_layout

# Types the numpy reference can turn into float32: the two native float types plus every
# quant type `gguf.quants` registers a dequantizer for.
REFERENCE_QTYPES: frozenset[GGMLQuantizationType] = frozenset(
    {GGMLQuantizationType.F32, GGMLQuantizationType.F16, *_dequantizable}
)

# Tensor types viewed as numbers; every other type is viewed as its raw uint8 blocks (as gguf.GGUFReader does).
_NATIVE_DTYPES: dict[GGMLQuantizationType, type[np.generic]] = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}
_INTEGER_TYPES = frozenset({
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
    GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
})
_FLOAT_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})
_REQUIRED: Any = ...


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

    def __init__(self, path: Path, layout: GGUFLayout, data: np.ndarray,
                 more_shards: tuple[tuple[Path, GGUFLayout, np.ndarray], ...] = ()):
        """`path` is the file (of a split set, the first shard, whose metadata is the model's);
        `more_shards` the rest of a split set, in order: their tensors join the table, each a view of
        its own shard's mapping."""
        self.path = path
        self.metadata: dict[str, Any] = layout.metadata
        self.value_types: dict[str, ValueType] = layout.value_types
        self.tensors: dict[str, TensorInfo] = {t.name: _tensor_view(t, data) for t in layout.tensors}
        self.shards: tuple[Path, ...] = (path, *(p for p, _, _ in more_shards))
        self.file_bytes = int(data.nbytes) + sum(int(d.nbytes) for _, _, d in more_shards)  # all shards
        holder = dict.fromkeys(self.tensors, path)
        for shard_path, shard_layout, shard_data in more_shards:
            for t in shard_layout.tensors:
                if t.name in holder:
                    raise ModelFileError(f"{shard_path.name}: tensor '{t.name}' is also in {holder[t.name].name}")
                holder[t.name] = shard_path
                self.tensors[t.name] = _tensor_view(t, shard_data)

    @property
    def architecture(self) -> str:
        return self.text("general.architecture")

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise ModelFileError(f"{self.path.name}: metadata key '{key}' is missing")
        return self.metadata[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    # -- typed metadata: the GGUF type and the range checked, the key named when either is wrong --

    def integer(self, key: str, default: Any = _REQUIRED, minimum: int = 0) -> int:
        """An integer-typed value, at least `minimum`."""
        value = self._typed(key, default, _INTEGER_TYPES, "an integer")
        if value < minimum:
            raise self._refuse(key, f"must be at least {minimum}", value)
        return int(value)

    def number(self, key: str, default: Any = _REQUIRED, positive: bool = False) -> float:
        """A finite float- or integer-typed value, >= 0 (> 0 when `positive`)."""
        value = self._typed(key, default, _FLOAT_TYPES | _INTEGER_TYPES, "a number")
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise self._refuse(key, f"must be a finite number {'> 0' if positive else '>= 0'}", value)
        return float(value)

    def flag(self, key: str, default: Any = _REQUIRED) -> bool:
        return bool(self._typed(key, default, frozenset({GGUFValueType.BOOL}), "a BOOL"))

    def text(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._typed(key, default, frozenset({GGUFValueType.STRING}), "a STRING")

    def integers(self, key: str, length: int, default: Any = _REQUIRED) -> tuple[int, ...]:
        """`length` integers as llama.cpp's get_key_or_arr reads them: a BOOL, INT32 or UINT32 array of
        exactly that length, or one integer repeated."""
        if key not in self.metadata:
            return self.require(key) if default is _REQUIRED else default
        vtype = self.value_types[key]
        if vtype.item is None:
            return (self.integer(key),) * length
        if vtype.item not in (GGUFValueType.BOOL, GGUFValueType.INT32, GGUFValueType.UINT32):
            raise self._refuse(key, "must be an array of BOOL, INT32 or UINT32", self.metadata[key])
        values = tuple(int(v) for v in self.metadata[key])
        if len(values) != length:
            raise self._refuse(key, f"must have {length} items", values)
        return values

    def _typed(self, key: str, default: Any, allowed: frozenset[GGUFValueType], expected: str) -> Any:
        if key not in self.metadata:
            return self.require(key) if default is _REQUIRED else default
        vtype = self.value_types[key]
        if vtype.item is not None or vtype.type not in allowed:
            raise self._refuse(key, f"must be {expected}", self.metadata[key])
        return self.metadata[key]

    def _refuse(self, key: str, rule: str, value: Any) -> ModelFileError:
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        return ModelFileError(f"{self.path.name}: metadata key '{key}' {rule}, found {self.value_types[key]} {shown}")

    # -- tensors -----------------------------------------------------------------------------------

    def tensor(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise ModelFileError(f"{self.path.name}: required tensor '{name}' is missing")
        return info

    def has_tensor(self, name: str) -> bool:
        return name in self.tensors


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open `path` as a GGUF file, raising ModelFileError with one line for anything wrong with it.

    A split model (`<prefix>-00001-of-00003.gguf`, as llama.cpp's gguf-split writes it) is given by its
    first shard; the other shards are found beside it by name and checked as llama.cpp checks them."""
    path = Path(path)
    layout, data = _map(path)
    f = GGUFFile(path, layout, data, _other_shards(path, layout))
    f.architecture  # noqa: B018 - present and a string, before anything asks for it
    f.text("tokenizer.chat_template", None)
    _check_vocabulary(f)
    return f


def _map(path: Path) -> tuple[GGUFLayout, np.ndarray]:
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    with path.open("rb") as fh:
        magic = fh.read(4)
        if magic != GGUF_MAGIC:  # also what an empty file, which cannot be mapped, gets
            raise ModelFileError(f"{path.name}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    return read_layout(mapped, path.name), np.frombuffer(mapped, dtype=np.uint8)


# llama.cpp's llama_split_path: "%s-%05d-of-%05d.gguf", the shard number 1-based.
_SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5,})-of-(?P<count>\d{5,})\.gguf$")
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"  # gguf.Keys.Split


def split_shard_name(prefix: str, number: int, count: int) -> str:
    """The name of shard `number` (1-based) of `count`, as llama.cpp's llama_split_path makes it."""
    return f"{prefix}-{number:05d}-of-{count:05d}.gguf"


def _split_key(path: Path, layout: GGUFLayout, key: str, default: Any = _REQUIRED) -> int:
    """An integer split key of one shard, checked as GGUFFile.integer checks metadata."""
    probe = GGUFFile.__new__(GGUFFile)
    probe.path, probe.metadata, probe.value_types = path, layout.metadata, layout.value_types
    return probe.integer(key, default)


def _other_shards(path: Path, layout: GGUFLayout) -> tuple[tuple[Path, GGUFLayout, np.ndarray], ...]:
    """The rest of the split set whose first shard is `path`: () for a file that is not split."""
    named = _SPLIT_NAME.match(path.name)
    count = _split_key(path, layout, SPLIT_COUNT, 0)
    if count <= 1:
        if named and int(named["count"]) > 1:
            raise ModelFileError(
                f"{path.name}: the name says shard {int(named['no'])} of {int(named['count'])} of a split model, "
                f"but metadata key '{SPLIT_COUNT}' is {'missing' if SPLIT_COUNT not in layout.metadata else count}"
            )
        return ()
    number = _split_key(path, layout, SPLIT_NO)
    if named is None:
        raise ModelFileError(
            f"{path.name}: shard {number + 1} of a split model of {count}, but the name does not end in "
            f"-{number + 1:05d}-of-{count:05d}.gguf, so the other shards cannot be found"
        )
    prefix = named["prefix"]
    if number != 0:
        raise ModelFileError(
            f"{path.name}: is shard {number + 1} of {count} of a split model; give its first shard, "
            f"{split_shard_name(prefix, 1, count)}"
        )
    if (int(named["no"]), int(named["count"])) != (1, count):
        raise ModelFileError(
            f"{path.name}: {SPLIT_NO} 0 and {SPLIT_COUNT} {count}, but the name says shard {int(named['no'])} "
            f"of {int(named['count'])}"
        )
    expected_tensors = _split_key(path, layout, SPLIT_TENSORS)
    shards = []
    for index in range(1, count):
        shard = path.with_name(split_shard_name(prefix, index + 1, count))
        if not shard.is_file():
            raise ModelFileError(f"{shard.name}: missing (shard {index + 1} of {count})")
        shard_layout, shard_data = _map(shard)
        shard_count = _split_key(shard, shard_layout, SPLIT_COUNT)
        if shard_count != count:
            raise ModelFileError(f"{shard.name}: {SPLIT_COUNT} {shard_count}, expected {count} (as in {path.name})")
        shard_no = _split_key(shard, shard_layout, SPLIT_NO)
        if shard_no != index:
            raise ModelFileError(f"{shard.name}: {SPLIT_NO} {shard_no}, expected {index}")
        shards.append((shard, shard_layout, shard_data))
    found = len(layout.tensors) + sum(len(s[1].tensors) for s in shards)
    if found != expected_tensors:
        raise ModelFileError(
            f"{path.name}: {SPLIT_TENSORS} {expected_tensors}, but the {count} shards hold {found} tensors"
        )
    return tuple(shards)


# The vocabulary arrays llama.cpp's loader indexes by token: the item types it accepts. It refuses
# others with "failed to load model", which names nothing; here the key is named.
_VOCABULARY_ARRAYS = {
    "tokenizer.ggml.tokens": (GGUFValueType.STRING,),
    "tokenizer.ggml.scores": (GGUFValueType.FLOAT32, GGUFValueType.INT32),
    "tokenizer.ggml.token_type": (GGUFValueType.INT32,),
    "tokenizer.ggml.merges": (GGUFValueType.STRING,),
}


def _check_vocabulary(f: GGUFFile) -> None:
    """The vocabulary as llama.cpp's loader assumes it: arrays of the types it reads, a score and a type
    per token, and no token text twice (that one aborts the whole process there, a GGML_ASSERT)."""
    for key, items in _VOCABULARY_ARRAYS.items():
        vtype = f.value_types.get(key)
        if vtype is not None and vtype.item not in items:
            expected = " or ".join(f"an array of {t.name}" for t in items)
            raise f._refuse(key, f"must be {expected}", f.metadata[key])
    tokens = f.get("tokenizer.ggml.tokens")
    if tokens is None:
        return  # llama.cpp says the vocabulary is missing; info has no use for it
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if key in f.metadata and len(f.metadata[key]) < len(tokens):
            raise ModelFileError(
                f"{f.path.name}: metadata key '{key}' has {len(f.metadata[key])} items for {len(tokens)} tokens"
            )
    distinct = set(tokens)
    if len(distinct) == len(tokens) and "" not in distinct:
        return
    first: dict[str, int] = {}
    for index, text in enumerate(tokens):
        text = text or f"[EMPTY_{index}]"  # llama.cpp's name for an empty token
        if first.setdefault(text, index) != index:
            raise ModelFileError(
                f"{f.path.name}: metadata key 'tokenizer.ggml.tokens' has token {index} equal to token "
                f"{first[text]} ({text!r})"
            )


def check_reference_qtype(info: TensorInfo) -> None:
    """Refuse a tensor whose quant type the reference path cannot dequantize."""
    if info.qtype not in REFERENCE_QTYPES:
        names = ", ".join(sorted(t.name for t in REFERENCE_QTYPES))
        raise ModelFileError(f"tensor '{info.name}' has unsupported quant type {info.qtype.name}; supported: {names}")


def _tensor_view(t: TensorEntry, data: np.ndarray) -> TensorInfo:
    """The tensor's bytes in `data` (the whole file, mapped) as gguf.GGUFReader shapes them."""
    shape = tuple(reversed(t.ne))
    raw = data[t.offset : t.offset + t.nbytes]
    dtype = _NATIVE_DTYPES.get(t.qtype)
    if dtype is not None:
        view = raw.view(dtype).reshape(shape)
    else:
        view = raw.reshape(quant_shape_to_byte_shape(shape, t.qtype))
    return TensorInfo(name=t.name, qtype=t.qtype, shape=shape, data=view, offset=t.offset)
