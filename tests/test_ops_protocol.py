"""Both backends implement the Ops protocol the model definitions are written against.

CudaOps cannot be imported without CuPy, so its class is read from the source: every protocol method
must be there with the same parameter names, so a call written against the protocol works on both.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import runner.backends.cuda as cuda_backend
from runner.backends.hybrid_ops import HybridOps
from runner.backends.numpy.ops import NumpyOps
from runner.backends.ops import Ops

PROTOCOL_METHODS = {name: fn for name, fn in vars(Ops).items() if inspect.isfunction(fn) and not name.startswith("_")}


def _parameters(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_numpy_ops_implements_every_protocol_method_with_its_parameters() -> None:
    ops = NumpyOps()
    assert isinstance(ops, Ops)
    for name, fn in PROTOCOL_METHODS.items():
        assert _parameters(getattr(NumpyOps, name)) == _parameters(fn), name


def _source_methods(file: str, class_name: str) -> tuple[ast.ClassDef, dict[str, list[str]]]:
    source = Path(cuda_backend.__file__).with_name(file).read_text()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == class_name)
    return cls, {f.name: [a.arg for a in f.args.args] for f in cls.body if isinstance(f, ast.FunctionDef)}


def test_cuda_ops_source_implements_every_protocol_method_with_its_parameters() -> None:
    cls, methods = _source_methods("ops.py", "CudaOps")
    assert any(isinstance(n, ast.Assign) and n.targets[0].id == "name" for n in cls.body if isinstance(n, ast.Assign))
    for name, fn in PROTOCOL_METHODS.items():
        assert name in methods, f"CudaOps lacks {name}"
        assert methods[name] == _parameters(fn), name


def test_cuda_ops_source_implements_every_hybrid_method_with_its_parameters() -> None:
    """CudaOps takes the HybridOps methods from CudaHybridOps (backends/cuda/hybrid.py)."""
    cls, _ = _source_methods("ops.py", "CudaOps")
    assert [b.id for b in cls.bases if isinstance(b, ast.Name)] == ["CudaHybridOps"]
    _, methods = _source_methods("hybrid.py", "CudaHybridOps")
    for name, fn in vars(HybridOps).items():
        if inspect.isfunction(fn) and not name.startswith("_"):
            assert name in methods, f"CudaHybridOps lacks {name}"
            assert methods[name] == _parameters(fn), name
