"""scripts/bench/h2h_table.py joins llama-bench's JSON and bench_offload's JSON into medians and ratios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _llama_test(n_prompt: int, n_gen: int, depth: int, ubatch: int, samples: list[float]) -> dict:
    return {"n_prompt": n_prompt, "n_gen": n_gen, "n_depth": depth, "n_ubatch": ubatch, "n_threads": 8,
            "tensor_buft_overrides": "exps=CPU", "n_cpu_moe": 0, "samples_ts": samples,
            "avg_ts": sum(samples) / len(samples)}


def _spread(values: list[float]) -> dict:
    s = sorted(values)
    return {"median": s[len(s) // 2], "min": s[0], "max": s[-1], "n": len(s)}


def test_ratios_medians_and_analytic_crossings(tmp_path: Path) -> None:
    (tmp_path / "l512.json").write_text(json.dumps([_llama_test(2048, 0, 0, 512, [900.0, 1000.0, 1100.0]),
                                                    _llama_test(0, 32, 1024, 512, [20.0, 25.0, 30.0])]))
    (tmp_path / "l2048.json").write_text(json.dumps([_llama_test(2048, 0, 0, 2048, [2000.0, 2100.0, 1900.0])]))
    (tmp_path / "p.json").write_text(json.dumps({
        "expert_set_bytes": 1000, "environment": {"gpu": "test"},
        "lengths": {"2048": {"prefill_tok_s": _spread([3000.0, 4000.0, 5000.0]), "ttft_s": _spread([0.5, 0.5, 0.6]),
                             "expert_sets": _spread([1.0, 1.0, 1.0])}}}))
    (tmp_path / "d.json").write_text(json.dumps({
        "contexts": {"1024": {"decode_tok_s": _spread([50.0, 60.0, 70.0]), "hit_rate": _spread([0.5, 0.5, 0.5])}}}))
    (tmp_path / "commands.txt").write_text("llama-bench -m m.gguf\nbench_offload prefill m.gguf\n")
    out = tmp_path / "h2h.json"
    done = subprocess.run([sys.executable, "-m", "scripts.bench.h2h_table", "--llama", str(tmp_path / "l512.json"),
                           str(tmp_path / "l2048.json"), "--ours-prefill", str(tmp_path / "p.json"),
                           "--ours-decode", str(tmp_path / "d.json"), "--commands", str(tmp_path / "commands.txt"),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, check=True)
    t = json.loads(out.read_text())["table"]
    pre = t["prefill"]["2048"]
    assert pre["ratio"]["ours / llama.cpp ub512"] == 4000.0 / 1000.0
    assert pre["ratio"]["ours / llama.cpp ub2048"] == 4000.0 / 2000.0
    assert pre["llama.cpp"]["ub512"]["expert_sets_analytic"] == 4.0  # 2048 tokens in micro-batches of 512
    assert pre["llama.cpp"]["ub2048"]["tok_s"] == {"median": 2000.0, "min": 1900.0, "max": 2100.0, "n": 3}
    assert t["decode"]["1024"]["ratio"]["ours / llama.cpp ub512"] == 60.0 / 25.0
    assert "| prefill tok/s, 2048 prompt tokens, llama.cpp ub512 | 4000.0 (3000.0-5000.0) |" in done.stdout
    assert json.loads(out.read_text())["commands"][0] == "llama-bench -m m.gguf"
