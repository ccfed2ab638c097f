"""scripts/bench/fill_evidence.py writes a profile's measured evidence from the qualification run's JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _s(median: float) -> dict:
    return {"median": median, "min": median * 0.9, "max": median * 1.1, "n": 3}


def _env() -> dict:
    return {"gpu": "NVIDIA H200", "cuda_runtime": 13020, "cupy": "14.2.0", "commit": "abc1234"}


def _run_dir(tmp_path: Path, n_layer: int, with_decode: bool = True) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "bandwidth.json").write_text(json.dumps({"pinned_gb_s": _s(55.36), "environment": _env()}))
    lengths = {str(n): {"ttft_s": _s(t), "expert_sets": _s(1.0), "release_s": _s(0.004), "restore_s": _s(0.012)}
               for n, t in ((2048, 0.5), (8192, 2.5), (32768, 21.0))}
    (run / "prefill_layer_major_2048.json").write_text(json.dumps(
        {"benchmark": "offload_prefill", "model": "seed48.gguf", "n_layer": n_layer, "environment": _env(),
         "lengths": lengths, "budget": {"peak_bytes": 20_000_000_000}}))
    (run / "prefill_per_microbatch_2048.json").write_text(json.dumps(
        {"benchmark": "offload_prefill", "model": "seed48.gguf", "n_layer": n_layer, "environment": _env(),
         "lengths": {"8192": {"ttft_s": _s(2.2), "expert_sets": _s(4.0)}}, "budget": {"peak_bytes": 21_000_000_000}}))
    if with_decode:
        (run / "decode_150.json").write_text(json.dumps(
            {"benchmark": "offload_decode", "model": "seed48.gguf", "n_layer": n_layer, "environment": _env(),
             "contexts": {"1024": {"decode_tok_s": _s(40.0), "hit_rate": _s(0.86)},
                          "8192": {"decode_tok_s": _s(33.0), "hit_rate": _s(0.85)}},
             "budget": {"peak_bytes": 19_000_000_000}}))
        (run / "decode_auto.json").write_text(json.dumps(
            {"benchmark": "offload_decode", "model": "seed48.gguf", "n_layer": n_layer, "environment": _env(),
             "slots_per_layer": 243, "contexts": {"1024": {"decode_tok_s": _s(45.0), "hit_rate": _s(0.98)},
                                                  "8192": {"decode_tok_s": _s(44.0), "hit_rate": _s(0.97)}},
             "budget": {"peak_bytes": 25_000_000_000}}))
        (run / "decode_150_p2.json").write_text(json.dumps(  # a second process of the 150-slot arm
            {"benchmark": "offload_decode", "model": "seed48.gguf", "n_layer": n_layer,
             "environment": {**_env(), "commit": "def5678"},
             "contexts": {"1024": {"decode_tok_s": _s(44.0), "hit_rate": _s(0.86)}},
             "budget": {"peak_bytes": 19_000_000_000}}))
    return run


def _fill(tmp_path: Path, run: Path) -> subprocess.CompletedProcess:
    profile = tmp_path / "home-24g.toml"
    if not profile.exists():
        shutil.copy(ROOT / "profiles" / "home-24g.toml", profile)
    return subprocess.run([sys.executable, "-m", "scripts.bench.fill_evidence", str(profile), str(run), "--run-record",
                           "docs/perf/x.md"], cwd=ROOT, capture_output=True, text=True)


def test_every_measured_figure_comes_from_the_run(tmp_path: Path) -> None:
    done = _fill(tmp_path, _run_dir(tmp_path, 48))
    assert done.returncode == 0, done.stderr
    p = tomllib.loads((tmp_path / "home-24g.toml").read_text())
    m = p["evidence"]["measured"]
    assert m["pinned_h2d_gb_s"] == 55.36 and m["ttft_8k_s"] == 2.5 and m["ttft_32k_s"] == 21.0
    assert m["prefill_expert_sets_8k_layer_major"] == 1.0 and m["prefill_expert_sets_8k_per_microbatch_2048"] == 4.0
    assert m["decode_tok_s_ctx_1k"] == 42.0 and m["cache_hit_rate_150"] == 0.86  # the median of 40 and 44
    assert m["decode_tok_s_ctx_1k_processes"] == "40.0 to 44.0 tok/s over 2 processes"
    assert m["decode_tok_s_ctx_8k"] == 33.0 and m["decode_tok_s_ctx_8k_processes"] == "33.0 to 33.0 tok/s over 1 process"
    assert m["cache_slots_auto"] == 243 and m["decode_tok_s_ctx_8k_auto"] == 44.0 and m["cache_hit_rate_auto"] == 0.98
    assert m["peak_device_bytes"] == 25_000_000_000  # the largest peak of the run's benchmarks
    assert "pending" not in m.values()
    assert p["evidence"]["commit"] == "abc1234, def5678" and p["evidence"]["run_record"] == "docs/perf/x.md"
    assert p["evidence"]["run_data"] == str(tmp_path / "run")
    assert p["launch"]["cache_slots"] == 150  # the launch settings are untouched


def test_a_run_of_another_layer_count_is_refused_and_the_profile_unchanged(tmp_path: Path) -> None:
    before = (ROOT / "profiles" / "home-24g.toml").read_text()
    done = _fill(tmp_path, _run_dir(tmp_path, 16))
    assert done.returncode != 0
    assert done.stderr.strip() == "error: offload_prefill ran a model of 16 layers; the qualifying shape has 48"
    assert (tmp_path / "home-24g.toml").read_text() == before


def test_figures_the_run_lacks_stay_pending(tmp_path: Path) -> None:
    done = _fill(tmp_path, _run_dir(tmp_path, 48, with_decode=False))
    assert done.returncode == 0, done.stderr
    m = tomllib.loads((tmp_path / "home-24g.toml").read_text())["evidence"]["measured"]
    # the shipped profile holds a measured decode figure; a run without decode makes it pending again
    assert m["decode_tok_s_ctx_1k"] == "pending" and m["cache_slots_auto"] == "pending" and m["ttft_2k_s"] == 0.5
    assert "still pending: decode_tok_s_ctx_1k" in done.stdout
