"""scripts/bench/bench_grammar_mask (no timings asserted): it walks the document through every library
that imports, and reports the ones that do not instead of failing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_mask_benchmark_walks_the_document_and_writes_json(tmp_path) -> None:
    out = tmp_path / "mask.json"
    done = subprocess.run([sys.executable, "-m", "scripts.bench.bench_grammar_mask", "--rounds", "1", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    (demo,) = report["results"]
    assert demo["n_vocab"] == 2048 and demo["document_tokens"] > 0
    llg = demo["libraries"]["llguidance"]
    for grammar in ("json_schema", "gbnf_json"):  # the library the runner uses takes both workloads
        assert llg[grammar]["library_us_per_token"]["median"] > 0, llg[grammar]
    for name, row in demo["libraries"].items():
        assert row["available"] or "why" in row, name
    assert report["environment"]["python"]
