"""--devices through the real command: the split launch line, the same tokens, and one line per bad input."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from runner.cli.main import main
from runner.cli.support import SPLIT_NOTE
from runner.launch import split
from runner.launch.backend import BackendError
from runner.launch.split import check_devices


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def generate(path, *args: str) -> tuple[int, str, str]:
    return invoke("generate", str(path), "--backend", "numpy", "-p", "Hello there", "-n", "5", "--temperature", "0",
                  "--ignore-eos", "--json", *args)


@pytest.fixture(scope="module")
def path(synth_model):
    return synth_model("glm4moe", "Q8_0")


def test_two_emulated_cards_state_the_split_and_give_the_same_tokens(path) -> None:
    code, out, err = generate(path, "-c", "256")
    assert code == 0, err
    one = json.loads(out)
    # 6 MiB a card: less than the model needs on one, so it offloads and splits
    code, out, err = generate(path, "-c", "256", "--devices", "0,1", "--vram-budget", "0.006")
    assert code == 0, err
    two = json.loads(out)
    assert two["tokens"] == one["tokens"]
    line = err.strip()
    assert line.startswith("launch: ") and "\n" not in line
    assert "layers 0-" in line and "on cuda:0" in line and "on cuda:1" in line
    assert two["launch"]["split"]["devices"] == [0, 1] and two["launch"]["split"]["plan"] in line


def test_one_device_is_todays_launch(path) -> None:
    code, out, err = generate(path, "-c", "256", "--devices", "0")
    assert code == 0 and json.loads(out)["launch"]["split"] is None and "cuda:1" not in err


@pytest.mark.parametrize("value, message", [
    ("0,0", "device 0 is named twice"),
    ("0,-1", "device id -1 is negative"),
    ("0,8", "device 8 does not exist; the backend sees 8 devices"),
    ("a,b", "comma-separated device ids"),
])
def test_bad_device_lists_are_one_error_line(path, value: str, message: str) -> None:
    code, out, err = generate(path, "--devices", value)
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err


def test_cards_too_small_for_the_model_are_one_error_line(path) -> None:
    code, out, err = generate(path, "--devices", "0,1", "--vram-budget", "0.002")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "2 cards of 2.0 MiB cannot hold" in err


def test_llama_split_flags_are_answered_with_one_note(path) -> None:
    code, out, err = generate(path, "-ts", "3,1", "-sm", "row", "-dev", "CUDA0,CUDA1")
    assert code == 0 and json.loads(out)["completion_tokens"] == 5, err
    assert err.splitlines() == [SPLIT_NOTE]


def test_the_cuda_backend_refuses_a_split_and_other_ids_in_one_line(monkeypatch) -> None:
    monkeypatch.setattr(split, "_cuda_device_count", lambda: 2)
    assert check_devices("0", "cuda") == (0,)
    with pytest.raises(BackendError, match="planned for the cuda backend"):
        check_devices("0,1", "cuda")
    with pytest.raises(BackendError, match="CUDA_VISIBLE_DEVICES=1"):
        check_devices("1", "cuda")
    with pytest.raises(Exception, match="device 2 does not exist; the backend sees 2 devices"):
        check_devices("0,2", "cuda")
    assert check_devices("0,1,2", "numpy") == (0, 1, 2)


def test_profile_refuses_a_split_in_one_line(path, tmp_path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Hello there")
    code, out, err = invoke("profile", str(path), "--prompt-file", str(prompt), "--backend", "numpy", "--devices", "0,1")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "--devices 0,1 splits the layers" in err


def test_serve_on_two_emulated_cards_announces_the_split_and_answers(path) -> None:
    import signal

    import httpx
    from test_server_cli import serve, stderr_lines

    proc = serve(str(path), "--port", "0", "-c", "128", "--backend", "numpy", "--devices", "0,1")
    try:
        lines = stderr_lines(proc)
        seen = [lines.get(timeout=60)]
        while "serving" not in seen[-1]:
            seen.append(lines.get(timeout=60))
        assert any(line.startswith("launch: ") and "on cuda:1" in line for line in seen)
        url = seen[-1].split(" on ", 1)[1].split()[0]
        props = httpx.get(url.removesuffix("/v1") + "/props").json()
        assert props["launch"]["split"]["devices"] == [0, 1]
        reply = httpx.post(f"{url}/completions", json={"prompt": "Hello", "max_tokens": 3, "temperature": 0},
                           timeout=60).json()
        assert reply["usage"]["completion_tokens"] == 3
        cards = httpx.get(url.removesuffix("/v1") + "/props").json()["devices"]
        assert cards["transfers"] >= 3 and [d["device"] for d in cards["devices"]] == ["cuda:0", "cuda:1"]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130


def test_a_budget_per_card_is_one_error_line(path) -> None:
    code, out, err = generate(path, "--devices", "0,1", "--vram-budget", "24,24")
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and "with --devices every card gets that budget" in err
