"""The flags llama.cpp users type (issue 22): -m, -c, -n, -ub, -b, -ngl, --n-cpu-moe, -ot, --alias, --jinja,
--chat-template-file; each through the real command, with what it changes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from click.testing import CliRunner
from test_server_cli import serve, stderr_lines

from runner.cli.main import main
from runner.cli.support import PLACEMENT_NOTE, llama_flag_notes
from runner.engine.engine import Engine, EngineConfig
from runner.gguf_file import open_gguf

TEMPLATE = "<<{% for m in messages %}[{{ m['role'] }}|{{ m['content'] }}]{% endfor %}>>"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def generate_json(*args: str) -> dict:
    code, out, err = invoke("generate", "--json", "-p", "Hello", "--temperature", "0", "--ignore-eos", *args)
    assert code == 0, err
    return json.loads(out)


def test_m_names_the_model_and_two_different_models_are_one_error_line(synth_model, tmp_path: Path) -> None:
    path = str(synth_model("qwen3moe"))
    by_flag = generate_json("-m", path, "-n", "3")
    assert by_flag["tokens"] == generate_json(path, "-n", "3")["tokens"]
    assert generate_json(path, "--model", path, "-n", "2")["completion_tokens"] == 2  # the same one twice is fine
    code, out, err = invoke("generate", path, "-m", str(tmp_path / "other.gguf"), "-p", "Hi")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: two models given") and "other.gguf" in err


def test_n_and_n_predict_set_the_token_count(synth_model) -> None:
    path = str(synth_model("glm4moe"))
    assert generate_json(path, "-n", "4")["completion_tokens"] == 4
    assert generate_json(path, "--n-predict", "6")["completion_tokens"] == 6


def test_c_and_ctx_size_set_the_context(synth_model) -> None:
    path = str(synth_model("glm4moe"))
    for flag in ("-c", "--ctx-size"):  # -n past the room left stops at the context end, as llama.cpp does
        out = generate_json(path, "-n", "50", flag, "8")
        assert out["prompt_tokens"] + out["completion_tokens"] == 8 and out["finish_reason"] == "length"
    assert generate_json(path, "-n", "50", "-c", "64")["completion_tokens"] == 50


def test_ngl_runs_with_one_explanatory_line(synth_model) -> None:
    path = str(synth_model("glm4moe"))
    # greedy and past end-of-generation tokens (as generate_json): sampled at the default 0.8 with a random seed, a
    # tiny model's end token ended the run early now and then (CI saw 1 token of 3)
    proc = subprocess.run([sys.executable, "-m", "runner.cli", "generate", path, "-ngl", "99", "-p", "Hi", "-n", "3",
                           "--temperature", "0", "--ignore-eos", "--json"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["completion_tokens"] == 3  # not "-n gl"
    assert proc.stderr.splitlines() == [PLACEMENT_NOTE]
    assert "--cache-slots" in PLACEMENT_NOTE and "host RAM" in PLACEMENT_NOTE
    # All three placement flags together: still one line.
    code, out, err = invoke("generate", path, "--n-gpu-layers", "999", "--n-cpu-moe", "10", "-ot", "exps=CPU",
                            "-ot", "blk\\.1\\.=CUDA0", "-p", "Hi", "-n", "2", "--temperature", "0", "--ignore-eos",
                            "--json")
    assert code == 0 and json.loads(out)["completion_tokens"] == 2
    assert err.splitlines() == [PLACEMENT_NOTE]


def test_ub_sets_the_ubatch_and_b_is_noted_only_when_it_differs(synth_model) -> None:
    path = str(synth_model("glm4moe"))
    code, out, err = invoke("generate", path, "-ub", "7", "-b", "7", "-p", "Hi", "-n", "1", "--json", "--offload")
    assert code == 0, err
    assert json.loads(out)["launch"]["settings"]["server_ubatch"] == 7
    assert "note" not in err
    code, out, err = invoke("generate", path, "--ubatch-size", "16", "--batch-size", "2048", "-p", "Hi", "-n", "1",
                            "--json", "--offload")
    assert code == 0 and json.loads(out)["launch"]["settings"]["server_ubatch"] == 16
    assert [line for line in err.splitlines() if line.startswith("note")] == [
        "note: -b 2048 is ignored: the runner's prompt batch is the micro-batch (-ub/--ubatch, here 16)"]
    assert llama_flag_notes({"n_gpu_layers": None, "n_cpu_moe": None, "override_tensor": (), "batch_size": None},
                            None) == []


def test_chat_template_file_changes_the_rendered_prompt(synth_model, tmp_path: Path) -> None:
    path = synth_model("glm4moe")
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE)
    engine = Engine(open_gguf(path), EngineConfig(n_ctx=64), chat_template=TEMPLATE)
    assert engine.tokenizer.render_chat([{"role": "user", "content": "Hi"}]) == "<<[user|Hi]>>"
    templated = generate_json(str(path), "--chat", "-p", "Hi", "-n", "1", "--chat-template-file", str(template))
    assert templated["prompt_token_ids"] == generate_json(str(path), "-p", "<<[user|Hi]>>", "-n", "1")[
        "prompt_token_ids"]
    assert templated["prompt_token_ids"] != generate_json(str(path), "--chat", "-p", "Hi", "-n", "1")[
        "prompt_token_ids"]
    code, _, err = invoke("generate", str(path), "--chat-template-file", str(tmp_path / "none.jinja"), "-p", "Hi")
    assert code == 1 and err.count("\n") == 1 and "cannot read the chat template file" in err


def test_chat_takes_m_c_n_and_a_template_file(synth_model, tmp_path: Path) -> None:
    path = str(synth_model("glm4moe"))
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE)
    proc = subprocess.run([sys.executable, "-m", "runner.cli", "chat", "-m", path, "-c", "40", "-n", "3",
                           "--temperature", "0", "-ngl", "99", "--chat-template-file", str(template)],
                          input="Hi\n", capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert PLACEMENT_NOTE in proc.stderr.splitlines()
    assert "context 40 tokens" in proc.stderr
    # "<<[user|Hi]>>" and nothing else: the file's template would add its own role markers.
    n_prompt = len(Engine(open_gguf(path), EngineConfig(n_ctx=40)).tokenizer.encode(
        "<<[user|Hi]>>", add_special=True, parse_special=True))
    assert f"[{n_prompt} prompt tokens" in proc.stderr and "3 generated" in proc.stderr


def test_serve_alias_jinja_m_and_c(synth_model, tmp_path: Path) -> None:
    path = synth_model("qwen3moe")
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE)
    proc = serve("-m", str(path), "--port", "0", "-c", "96", "--alias", "my-moe", "--jinja",
                 "--chat-template-file", str(template), "-ngl", "99")
    try:
        lines = stderr_lines(proc)
        line, seen = "", []
        while "serving" not in line:
            line = lines.get(timeout=60)
            seen.append(line.rstrip("\n"))
        assert PLACEMENT_NOTE in seen
        assert line.startswith("serving my-moe on ") and "(context 96)" in line
        url = line.split(" on ", 1)[1].split()[0]
        assert [m["id"] for m in httpx.get(f"{url}/models").json()["data"]] == ["my-moe"]
        reply = httpx.post(f"{url}/chat/completions", timeout=60, json={
            "model": "my-moe", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "return_token_ids": True}).json()
        assert reply["model"] == "my-moe"
        engine = Engine(open_gguf(path), EngineConfig(n_ctx=96))
        expected = engine.tokenizer.encode("<<[user|Hi]>>", add_special=True, parse_special=True)
        assert reply["usage"]["prompt_tokens"] == len(expected)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130


def test_profile_takes_m(synth_model, tmp_path: Path) -> None:
    prompt = tmp_path / "p.txt"
    prompt.write_text("Once upon a time")
    out = tmp_path / "r.json"
    code, _, err = invoke("profile", "-m", str(synth_model("glm4moe")), "--prompt-file", str(prompt), "--gen", "2",
                          "-c", "64", "--json", str(out), "--backend", "numpy")
    assert code == 0, err
    assert out.exists()
    code, _, err = invoke("profile", "--prompt-file", str(prompt))
    assert code == 1 and err.startswith("error: missing the model: give MODEL or -m PATH")
