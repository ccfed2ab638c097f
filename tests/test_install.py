"""A plain `pip install .` (a wheel, not editable) carries everything the runner needs: the CUDA kernel
sources, the launch profiles and the demo model are found inside the installed package, away from any
checkout, and `runner info` and `runner generate` run from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
KERNELS = sorted(p.name for p in (REPO / "cuda").iterdir() if p.suffix in (".cu", ".cuh"))
PROFILES = sorted(p.name for p in (REPO / "profiles").glob("*.toml"))


def _run(args: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, a fresh venv outside the checkout with only that wheel installed; its dependencies
    are this environment's, reached through a path entry, not the editable install's finder)."""
    root = tmp_path_factory.mktemp("install")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "dist"),
          str(REPO)], cwd=root)
    wheel = next((root / "dist").glob("moe_offload_runner-*.whl"))
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=root)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd=root)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=root).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # numpy, gguf, llama_cpp, click ...
    return wheel, venv


def test_the_wheel_lists_the_kernels_the_profiles_and_the_demo_model(installed) -> None:
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"runner/kernels/{k}" for k in KERNELS} <= names
    assert {f"runner/profiles/{p}" for p in PROFILES} <= names and "runner/profiles/home-24g.toml" in names
    assert "runner/data/demo.gguf" in names


def test_the_installed_package_finds_its_data_inside_itself(installed, tmp_path) -> None:
    _, venv = installed
    probe = ("import json, runner; from runner.package_data import kernel_dir, profile_dir, demo_model_path;"
             "from runner.launch.profiles import load_profile;"
             "print(json.dumps({'package': runner.__file__, 'kernels': str(kernel_dir()),"
             "'kernel_files': sorted(p.name for p in kernel_dir().iterdir()), 'profiles': str(profile_dir()),"
             "'demo': str(demo_model_path()), 'home': load_profile('home-24g').name}))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    got = json.loads(_run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path, env=env).stdout)
    for key in ("package", "kernels", "profiles", "demo"):
        assert Path(got[key]).resolve().is_relative_to(venv.resolve()), f"{key} found outside the venv: {got[key]}"
    assert set(KERNELS) <= set(got["kernel_files"])
    assert got["home"] == "home-24g"


def test_runner_info_and_generate_run_from_the_installed_package(installed, tmp_path) -> None:
    _, venv = installed
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    runner = str(venv / "bin" / "runner")
    info = json.loads(_run([runner, "info", "--json"], cwd=tmp_path, env=env).stdout)
    assert info["architecture"] == "glm4moe" and info["has_nextn"]
    assert Path(info["file"]).resolve().is_relative_to(venv.resolve())
    out = json.loads(_run([runner, "generate", "--prompt", "What does curl do?", "--max-tokens", "8",
                           "--temperature", "0", "--backend", "numpy", "--json"], cwd=tmp_path, env=env).stdout)
    assert len(out["tokens"]) == 8 and out["text"].strip()
