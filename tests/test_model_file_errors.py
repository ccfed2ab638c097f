"""Every way a model file can be wrong gets one clear line, from the loader and from the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf_edit import rewrite_gguf

from runner.engine.engine import Engine
from runner.errors import ModelFileError
from runner.gguf_file import open_gguf
from runner.models.config import model_config
from runner.models.weights import load_weights


def load(path: Path) -> None:
    Engine.load(path)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="no such file"):
        open_gguf(tmp_path / "absent.gguf")


def test_foreign_file_reports_bad_magic(tmp_path: Path) -> None:
    path = tmp_path / "notes.gguf"
    path.write_text("this is a text file, not a model\n")
    with pytest.raises(ModelFileError, match=r"not a GGUF file \(magic b'this'"):
        open_gguf(path)


@pytest.mark.parametrize("keep_fraction", [0.002, 0.5, 0.999])
def test_truncated_file_is_reported(tmp_path: Path, synth_model, keep_fraction: float) -> None:
    good = synth_model("glm4moe").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(good[: int(len(good) * keep_fraction)])
    with pytest.raises(ModelFileError, match="truncated"):
        open_gguf(path)


def test_unsupported_architecture_names_the_supported_ones(tmp_path: Path, synth_model) -> None:
    path = rewrite_gguf(synth_model("qwen3moe"), tmp_path / "llama.gguf", {"general.architecture": "llama"})
    with pytest.raises(ModelFileError, match=r"unsupported architecture 'llama'; supported: glm4moe, qwen3moe"):
        model_config(open_gguf(path))


def test_unsupported_quant_type_names_tensor_and_type(tmp_path: Path, synth_model) -> None:
    def to_q8_k(name: str, qtype: QT, data: np.ndarray):
        if name == "blk.1.attn_q.weight":  # Q8_K is llama.cpp's activation type: no dequantizer exists
            rows, cols = data.shape
            return name, QT.Q8_K, np.zeros((rows, cols // 256 * 292), dtype=np.uint8)
        return name, qtype, data

    path = rewrite_gguf(synth_model("glm4moe"), tmp_path / "q8k.gguf", tensor_edit=to_q8_k)
    with pytest.raises(ModelFileError, match=r"tensor 'blk.1.attn_q.weight' has unsupported quant type Q8_K"):
        load(path)


def test_missing_tensor_is_named(tmp_path: Path, synth_model) -> None:
    def drop(name: str, qtype: QT, data: np.ndarray):
        return None if name == "blk.1.ffn_up_exps.weight" else (name, qtype, data)

    path = rewrite_gguf(synth_model("glm4moe"), tmp_path / "missing.gguf", tensor_edit=drop)
    with pytest.raises(ModelFileError, match=r"required tensor 'blk.1.ffn_up_exps.weight' is missing"):
        load(path)


def test_shape_mismatch_names_both_shapes(tmp_path: Path, synth_model) -> None:
    def shrink(name: str, qtype: QT, data: np.ndarray):
        return (name, qtype, data[:, :128].copy()) if name == "blk.0.attn_k.weight" else (name, qtype, data)

    path = rewrite_gguf(synth_model("qwen3moe"), tmp_path / "shape.gguf", tensor_edit=shrink)
    f = open_gguf(path)
    with pytest.raises(ModelFileError, match=r"'blk.0.attn_k.weight' has shape \[128, 128\], expected \[128, 256\]"):
        load_weights(f, model_config(f))


def test_cli_prints_one_line_and_fails(tmp_path: Path) -> None:
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"GGUF" + b"\xff" * 12)
    result = subprocess.run([sys.executable, "-m", "runner.cli", "info", str(path)], capture_output=True, text=True)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: junk.gguf:"), result.stderr
