"""The real `runner` command: generate --json, synth, info, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runner.parity.llama_oracle import LlamaOracle


def runner(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_synth_then_generate_json_matches_llama_cpp_greedy(tmp_path: Path) -> None:
    path = tmp_path / "q.gguf"
    made = runner("synth", str(path), "--arch", "qwen3moe", "--preset", "tiny", "--quant", "F32", "--seed", "11")
    assert made.returncode == 0, made.stderr
    out = runner("generate", str(path), "--prompt", "Once upon a time", "--max-tokens", "20",
                 "--temperature", "0", "--ignore-eos", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["prompt_tokens"] == len(result["prompt_token_ids"])
    assert result["completion_tokens"] == len(result["tokens"]) == 20
    assert result["finish_reason"] == "length"
    assert result["prefill_s"] > 0 and result["decode_tok_s"] > 0
    with LlamaOracle(path, n_ctx=128) as oracle:
        assert result["tokens"] == oracle.greedy(result["prompt_token_ids"], 20)


def test_generate_streams_text_and_summary(tmp_path: Path, synth_model) -> None:
    out = runner("generate", str(synth_model("glm4moe")), "-p", "Hi", "-n", "5", "--seed", "1", "--chat")
    assert out.returncode == 0, out.stderr
    assert "prompt tokens" in out.stderr and "tok/s decode" in out.stderr


def test_info_json_and_table(synth_model) -> None:
    path = str(synth_model("glm4moe"))
    table = runner("info", path)
    assert table.returncode == 0 and "routed set" in table.stdout and "expert slot" in table.stdout
    data = json.loads(runner("info", path, "--json").stdout)
    assert data["architecture"] == "glm4moe" and data["has_nextn"] is True


def test_default_model_is_the_trained_demo_and_answers_in_english() -> None:
    """The embedded default is the project's trained model (docs/demo-model.md): asked about a package it
    knows, it answers with that package's description, not the gibberish a random-weight model gives."""
    out = runner("generate", "--chat", "-p", "What does curl do?", "-n", "24", "--temperature", "0", "--json")
    assert out.returncode == 0, out.stderr
    text = json.loads(out.stdout)["text"].lower()
    assert "curl" in text and "transferring data" in text


def test_bad_arguments_give_one_line(tmp_path: Path, synth_model) -> None:
    long_prompt = runner("generate", str(synth_model("qwen3moe")), "-p", "x " * 50, "-n", "10", "--n-ctx", "32")
    assert long_prompt.returncode == 1
    assert long_prompt.stderr.strip().count("\n") == 0 and "exceeds the context" in long_prompt.stderr
    bad_preset = runner("synth", str(tmp_path / "x.gguf"), "--preset", "nope")
    assert bad_preset.returncode == 1 and bad_preset.stderr.startswith("error: unknown preset 'nope'")
