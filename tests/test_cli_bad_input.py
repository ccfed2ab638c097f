"""Hostile or mistyped command lines: every one ends in exactly one `error: ...` line and exit code 1, never a
traceback (an argument that is not UTF-8, nan/inf budgets, out-of-range integers, profiles that are not profiles)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.errors import ProfileError
from runner.launch.backend import BackendConfig
from runner.launch.profiles import LaunchSettings, load_profile
from runner.launch.resolve import LaunchOptions

EVIDENCE = "[evidence]\nqualified_on = 'a test'\n"


def runner_bytes(*args: str | bytes) -> subprocess.CompletedProcess:
    """`python -m runner.cli ARGS`, arguments passed as given (bytes reach the process undecoded)."""
    argv = [os.fsencode(a) for a in (sys.executable, "-m", "runner.cli", *args)]
    return subprocess.run(argv, capture_output=True, timeout=120)


def assert_one_error_line(done: subprocess.CompletedProcess, starts: str) -> None:
    err = done.stderr.decode("utf-8", "replace")
    lines = err.splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert starts in lines[0], err


@pytest.fixture(scope="module")
def model(synth_model) -> str:
    return str(synth_model("glm4moe"))


def generate(model: str, *args: str | bytes) -> subprocess.CompletedProcess:
    return runner_bytes("generate", model, "-p", "hi", "-n", "2", "--backend", "numpy", *args)


@pytest.mark.parametrize("option", ["--prompt", "--stop"])
def test_text_that_is_not_utf8_is_refused_by_name(model: str, option: str) -> None:
    done = runner_bytes("generate", model, "-n", "2", "--backend", "numpy", "--prompt", "hi", option, b"\xffhi")
    assert_one_error_line(done, f"'{option}'")
    assert "not valid UTF-8 (byte 0xff at character 0)" in done.stderr.decode()


@pytest.mark.parametrize("budget", ["nan", "inf", "1e-30", "lots"])
def test_vram_budget_must_be_a_finite_positive_number_of_gib(model: str, budget: str) -> None:
    done = generate(model, "--vram-budget", budget, "--offload")
    assert_one_error_line(done, "invalid value for '--vram-budget'")


@pytest.mark.parametrize("args, says", [
    (["--seed", str(2**64)], "invalid value for '--seed'"),
    (["--seed", "-1"], "invalid value for '--seed'"),
    (["--n-ctx", "0"], "invalid value for '--n-ctx'"),
    (["--ubatch", "0"], "invalid value for '--ubatch'"),
    (["--draft-depth", "9"], "invalid value for '--draft-depth'"),
    (["--max-tokens", "99999999999999999999", "--n-ctx", "1"], "exceeds the context"),  # the prompt leaves no room
    (["--no-such-flag"], "no such option"),
])
def test_integers_out_of_range_and_unknown_flags_are_one_line(model: str, args: list[str], says: str) -> None:
    assert_one_error_line(generate(model, *args), says)


@pytest.mark.parametrize("args, says", [
    (["--seed", "-1"], "invalid value for '--seed'"),  # was a traceback from a worker process
    (["--layers", str(10**14)], "invalid value for '--layers'"),  # was a tensor plan filling the host
    (["--experts", str(10**14)], "invalid value for '--experts'"),  # was a struct.error writing the header
    (["--jobs", str(10**14)], "invalid value for '--jobs'"),
])
def test_synth_sizes_and_seeds_out_of_range_are_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    done = runner_bytes("synth", str(tmp_path / "x.gguf"), *args)
    assert_one_error_line(done, says)
    assert not (tmp_path / "x.gguf").exists()


def test_a_path_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder" / "x.gguf"
    assert_one_error_line(runner_bytes("synth", str(missing)), f"error: {missing}: No such file or directory")


def test_parity_text_that_is_not_utf8_is_refused_before_any_work(model: str) -> None:
    assert_one_error_line(runner_bytes("parity", model, "--prompt", b"\xc3("), "invalid value for '--prompt'")


def test_a_huge_context_is_capped_at_the_models_training_context(model: str) -> None:
    done = generate(model, "--n-ctx", str(10**30))
    assert done.returncode == 0, done.stderr


def test_a_missing_argument_or_command_is_one_line() -> None:
    assert_one_error_line(runner_bytes("generate"), "missing option '--prompt'")
    assert_one_error_line(runner_bytes("frobnicate"), "no such command 'frobnicate'")


def test_a_prompt_file_that_is_a_directory_binary_or_endless_is_one_line(model: str, tmp_path: Path) -> None:
    assert_one_error_line(runner_bytes("profile", model, "--prompt-file", str(tmp_path)), "'--prompt-file'")
    binary = tmp_path / "prompt.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 64)
    done = runner_bytes("profile", model, "--prompt-file", str(binary), "--backend", "numpy")
    assert_one_error_line(done, "cannot read the prompt file")
    done = runner_bytes("profile", model, "--prompt-file", "/dev/zero", "--backend", "numpy")  # endless: not read
    assert_one_error_line(done, "cannot read the prompt file /dev/zero: not a regular file")


@pytest.mark.parametrize("content, says", [
    (b"\xff\xfe\x00binary", "not a TOML profile (not UTF-8 text"),
    (b"root:x:0:0:root:/root:/bin/bash\n", "not valid TOML"),
    (b"[launch]\nvram_budget_gib = inf\n" + EVIDENCE.encode(), "--vram-budget must be a positive number of GiB"),
    (b"[launch]\nvram_budget_gib = nan\n" + EVIDENCE.encode(), "--vram-budget must be a positive number of GiB"),
    (b"[launch]\nvram_budget_gib = '24'\n" + EVIDENCE.encode(), "got '24'"),
    (b"[launch]\nserver_ubatch = true\n" + EVIDENCE.encode(), "--ubatch must be a positive integer, got True"),
    (b"[launch]\ncache_slots = true\n" + EVIDENCE.encode(), "--cache-slots must be a positive integer"),
    (b"[launch]\ndrafter = 'mtp'\ndraft_depth = '2'\n" + EVIDENCE.encode(), "--draft-depth must be an integer"),
    (b"profile = 'x'\n[launch]\n" + EVIDENCE.encode(), "[profile] must be a table"),
    (b"[profile]\nname = 3\n[launch]\n" + EVIDENCE.encode(), "[profile] must be a table"),
    (b"# " + b"x" * (1 << 20) + b"\n", "larger than the 1 MiB a profile may have"),
])
def test_a_profile_that_is_not_a_profile_is_one_profile_error(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "p.toml"
    path.write_bytes(content)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_a_profile_path_that_is_a_directory_binary_or_not_toml_is_one_line(model: str, tmp_path: Path) -> None:
    (tmp_path / "dir.toml").mkdir()
    assert_one_error_line(generate(model, "--profile", str(tmp_path / "dir.toml")), "no profile")
    (tmp_path / "bin.toml").write_bytes(b"\xff\x00")
    assert_one_error_line(generate(model, "--profile", str(tmp_path / "bin.toml")), "not a TOML profile")
    (tmp_path / "inf.toml").write_text("[launch]\nvram_budget_gib = inf\n" + EVIDENCE)
    assert_one_error_line(generate(model, "--profile", str(tmp_path / "inf.toml")), "--vram-budget must be")


@pytest.mark.parametrize("budget", [float("nan"), float("inf"), 0.0, True, "24"])
def test_every_launch_configuration_refuses_a_budget_that_is_not_a_number_of_gib(budget) -> None:
    with pytest.raises(ProfileError, match="--vram-budget must be a positive number of GiB"):
        LaunchOptions(vram_budget_gib=budget)
    with pytest.raises(ProfileError, match="--vram-budget must be a positive number of GiB"):
        LaunchSettings(vram_budget_gib=budget)
    with pytest.raises(Exception, match="--vram-budget must be a positive number of GiB"):
        BackendConfig("cuda", vram_budget_gib=budget)


@pytest.mark.parametrize("args, says", [
    (["--max-body-mb", "nan"], "invalid value for '--max-body-mb'"),
    (["--max-body-mb", "inf"], "invalid value for '--max-body-mb'"),
    (["--max-body-mb", "0"], "invalid value for '--max-body-mb'"),
    (["--api-key", b"\xffkey"], "invalid value for '--api-key'"),
])
def test_serve_refuses_a_bad_option_before_it_listens(model: str, args: list, says: str) -> None:
    assert_one_error_line(runner_bytes("serve", model, "--port", "0", "--backend", "numpy", *args), says)
