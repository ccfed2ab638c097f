"""Both backends implement the Ops protocol the model definitions are written against.

CudaOps cannot be imported without CuPy, so its class is read from the source: every protocol method
must be there with the same parameter names, so a call written against the protocol works on both.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import runner.backends.cuda as cuda_backend
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


def test_cuda_ops_source_implements_every_protocol_method_with_its_parameters() -> None:
    source = Path(cuda_backend.__file__).with_name("ops.py").read_text()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "CudaOps")
    methods = {f.name: [a.arg for a in f.args.args] for f in cls.body if isinstance(f, ast.FunctionDef)}
    assert any(isinstance(n, ast.Assign) and n.targets[0].id == "name" for n in cls.body if isinstance(n, ast.Assign))
    for name, fn in PROTOCOL_METHODS.items():
        assert name in methods, f"CudaOps lacks {name}"
        assert methods[name] == _parameters(fn), name
