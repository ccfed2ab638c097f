"""Backend choice on the command line: auto picks what the machine has; an impossible ask is one line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from runner.backends.cuda.kernels import gpu_available
from runner.cli.main import main
from runner.launch.backend import BackendConfig, BackendError, make_ops

no_gpu = pytest.mark.skipif(gpu_available(), reason="checks the behaviour on a machine without a GPU")


@no_gpu
def test_auto_backend_is_numpy_without_a_gpu() -> None:
    assert make_ops(BackendConfig("auto")).name == "numpy"


@no_gpu
def test_cuda_backend_without_a_gpu_is_a_one_line_error(synth_model) -> None:
    result = CliRunner().invoke(main, ["generate", str(synth_model("glm4moe")), "-p", "hi", "--backend", "cuda"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --backend cuda:"), result.output


def test_vram_budget_is_refused_on_the_numpy_backend() -> None:
    with pytest.raises(BackendError, match="cuda backend only"):
        make_ops(BackendConfig("numpy", vram_budget_gib=24))


@pytest.mark.parametrize("bad", [0, -1.5])
def test_vram_budget_must_be_positive(bad: float) -> None:
    with pytest.raises(BackendError, match="positive"):
        BackendConfig("cuda", vram_budget_gib=bad)


def test_generate_reports_the_backend_it_ran_on(synth_model) -> None:
    result = CliRunner().invoke(main, ["generate", str(synth_model("qwen3moe")), "-p", "hi", "-n", "3",
                                       "--temperature", "0", "--backend", "numpy", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["backend"] == "numpy"
