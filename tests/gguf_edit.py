"""Copy a GGUF file with edits, to make the broken files the loader must refuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np
from gguf import GGUFReader, GGUFValueType

# A tensor edit gets (name, qtype, raw data) and returns the same triple changed, or None to drop it.
TensorEdit = Callable[[str, gguf.GGMLQuantizationType, np.ndarray], "tuple[str, gguf.GGMLQuantizationType, np.ndarray] | None"]


def rewrite_gguf(src: Path, dst: Path, metadata: dict[str, Any] | None = None,
                 tensor_edit: TensorEdit | None = None) -> Path:
    reader = GGUFReader(src)
    arch = (metadata or {}).get("general.architecture") or reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub)
    for key, value in (metadata or {}).items():
        if key != "general.architecture":
            w.add_key_value(key, value, GGUFValueType.STRING if isinstance(value, str) else GGUFValueType.UINT32)
    for t in reader.tensors:
        item = (t.name, t.tensor_type, np.array(t.data))
        if tensor_edit is not None:
            item = tensor_edit(*item)
        if item is None:
            continue
        name, qtype, data = item
        w.add_tensor(name, data, raw_dtype=qtype if data.dtype == np.uint8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
