"""Session fixtures: tiny synthesized models of both architectures, written once per test run."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def synth_model(model_dir: Path):
    """synth_model(arch, quant="F32", preset="tiny", seed=0, **overrides) -> path, cached per arguments."""
    from runner.synth import synthesize  # imported here: the GPU box has no llama_cpp for the CUDA-only tests

    made: dict[tuple, Path] = {}

    def make(arch: str, quant: str = "F32", preset: str = "tiny", seed: int = 0, **overrides: int) -> Path:
        key = (arch, quant, preset, seed, tuple(sorted(overrides.items())))
        if key not in made:
            extra = "-".join(f"{k}{v}" for k, v in sorted(overrides.items()))
            path = model_dir / f"{arch}-{preset}-{quant}-s{seed}{'-' + extra if extra else ''}.gguf"
            synthesize(path, arch, preset, quant, seed, **overrides)
            made[key] = path
        return made[key]

    return make
