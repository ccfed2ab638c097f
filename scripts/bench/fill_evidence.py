"""Fill a profile's [evidence.measured] from the qualification run's benchmark JSON, never by hand.

Reads the files `scripts/bench/qualify_home24g.sh` writes (bench_offload's bandwidth, prefill per order,
decode at the profile's slot count and at `--cache-slots auto`) and sets each figure of the profile's [evidence.measured] to
its median, and [evidence]'s hardware, commit(s), run record and run data (the JSON directory). Refuses
a run whose model is not the profile's qualifying shape (its layer count must match). A figure the
run lacks becomes "pending", whatever an earlier run put there: the evidence is one run's.

Decode speed varies more from process to process than within one (the GPU box's host work), so a decode
arm may be run in several processes: decode_150.json, decode_150_p2.json, ... Its speed figure is then
the median of their medians, and a `..._processes` figure states their range and count.

    python -m scripts.bench.fill_evidence profiles/home-24g.toml RUN_DIR --run-record docs/perf/X.md [--layers 48]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tomllib
from pathlib import Path
from typing import Any


class EvidenceError(Exception):
    pass


def _load(run: Path, name: str) -> dict[str, Any] | None:
    path = run / name
    return json.loads(path.read_text()) if path.exists() else None


def _median(d: dict[str, Any] | None, *keys: str) -> float | None:
    for k in keys:
        if d is None:
            return None
        d = d.get(k)
    return float(d["median"]) if isinstance(d, dict) and "median" in d else None


def _processes(run: Path, arm: str) -> list[dict[str, Any]]:
    """Every process's record of a decode arm: ARM.json first, then ARM_p2.json, ARM_p3.json, ..."""
    first = _load(run, f"{arm}.json")
    numbered = {int(m.group(1)): p for p in run.glob(f"{arm}_p*.json") if (m := re.fullmatch(rf"{arm}_p(\d+)", p.stem))}
    more = [numbered[n] for n in sorted(numbered)]
    return ([first] if first else []) + [json.loads(p.read_text()) for p in more]


def _speed(records: list[dict[str, Any]], context: str) -> tuple[float | None, str | None]:
    """The median over processes of their decode tok/s medians at `context`, and the range as text."""
    medians = [m for m in (_median(r, "contexts", context, "decode_tok_s") for r in records) if m is not None]
    if not medians:
        return None, None
    return statistics.median(medians), (f"{min(medians):.1f} to {max(medians):.1f} tok/s over {len(medians)} "
                                     f"process{'es' if len(medians) > 1 else ''}")


def measured(run: Path) -> tuple[dict[str, float | int | str], list[dict[str, Any]]]:
    """The [evidence.measured] figures found in `run`, and its prefill and decode records."""
    bw, lm = _load(run, "bandwidth.json"), _load(run, "prefill_layer_major_2048.json")
    pmb, decs = _load(run, "prefill_per_microbatch_2048.json"), _processes(run, "decode_150")
    autos = _processes(run, "decode_auto")
    dec, auto = (decs or [None])[0], (autos or [None])[0]
    figures = {
        "pinned_h2d_gb_s": _median(bw, "pinned_gb_s"),
        "ttft_2k_s": _median(lm, "lengths", "2048", "ttft_s"),
        "ttft_8k_s": _median(lm, "lengths", "8192", "ttft_s"),
        "ttft_32k_s": _median(lm, "lengths", "32768", "ttft_s"),
        "prefill_expert_sets_8k_layer_major": _median(lm, "lengths", "8192", "expert_sets"),
        "prefill_expert_sets_8k_per_microbatch_2048": _median(pmb, "lengths", "8192", "expert_sets"),
        "cache_hit_rate_150": _median(dec, "contexts", "1024", "hit_rate"),
        "phase_release_s": _median(lm, "lengths", "8192", "release_s"),
        "phase_restore_s": _median(lm, "lengths", "8192", "restore_s"),
        "cache_hit_rate_auto": _median(auto, "contexts", "1024", "hit_rate"),
    }
    for records, suffix in ((decs, ""), (autos, "_auto")):
        for context, name in (("1024", "1k"), ("8192", "8k")):
            figures[f"decode_tok_s_ctx_{name}{suffix}"], figures[f"decode_tok_s_ctx_{name}{suffix}_processes"] = \
                _speed(records, context)
    out: dict[str, float | int | str] = {k: v for k, v in figures.items() if v is not None}
    if auto and "slots_per_layer" in auto:
        out["cache_slots_auto"] = int(auto["slots_per_layer"])  # what auto chose, not a median
    runs = [d for d in (lm, pmb, *decs, *autos) if d]
    peaks = [d["budget"]["peak_bytes"] for d in runs if "budget" in d]
    if peaks:
        out["peak_device_bytes"] = int(max(peaks))
    if not runs:
        raise EvidenceError(f"{run} holds none of the qualification run's prefill or decode JSON files")
    return out, runs


def fill(profile_text: str, figures: dict[str, float | int], evidence: dict[str, str]) -> str:
    """`profile_text` with [evidence.measured]'s values (those `figures` lacks: "pending") and [evidence]'s
    fields replaced; comments and layout kept."""
    lines, section = profile_text.splitlines(keepends=True), None
    for i, line in enumerate(lines):
        header = re.match(r"\s*\[([^\]]+)\]", line)
        if header:
            section = header.group(1).strip()
            continue
        m = re.match(r"(\s*)([A-Za-z0-9_]+)(\s*=\s*)(\"[^\"]*\"|[-+0-9.eE_]+)(.*)", line, re.S)
        if not m:
            continue
        key = m.group(2)
        if section == "evidence.measured":
            value = figures.get(key, "pending")
            text = f"{value:.4g}" if isinstance(value, float) else json.dumps(value) if isinstance(value, str) else str(value)
            lines[i] = f"{m.group(1)}{key}{m.group(3)}{text}{m.group(5)}"
        elif section == "evidence" and key in evidence:
            lines[i] = f"{m.group(1)}{key}{m.group(3)}{json.dumps(evidence[key])}{m.group(5)}"
    out = "".join(lines)
    tomllib.loads(out)  # still a valid profile
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("run", type=Path, help="the qualification run's directory of JSON files")
    ap.add_argument("--run-record", required=True, help="the docs/perf/ record of the run")
    ap.add_argument("--layers", type=int, default=48, help="the qualifying shape's layer count")
    args = ap.parse_args()
    figures, runs = measured(args.run)
    for record in runs:
        if record.get("n_layer") != args.layers:
            raise EvidenceError(f"{record.get('benchmark')} ran a model of {record.get('n_layer', 'unstated')} layers; "
                                f"the qualifying shape has {args.layers}")
    model, env = str(runs[0].get("model")), runs[0].get("environment", {})
    commits = dict.fromkeys(str(r.get("environment", {}).get("commit", "unknown")) for r in runs)  # prefill's first
    evidence = {"hardware": f"{env.get('gpu', 'unknown GPU')} (CUDA runtime {env.get('cuda_runtime')}, CuPy "
                            f"{env.get('cupy')}), 24 GiB budget emulating a 24 GB card; model {model}",
                "commit": ", ".join(commits), "run_record": args.run_record, "run_data": str(args.run)}
    args.profile.write_text(fill(args.profile.read_text(), figures, evidence))
    pending = [k for k in tomllib.loads(args.profile.read_text())["evidence"]["measured"] if k not in figures]
    print(f"filled {len(figures)} figures into {args.profile}" + (f"; still pending: {', '.join(pending)}" if pending else ""))


if __name__ == "__main__":
    try:
        main()
    except EvidenceError as exc:
        sys.exit(f"error: {exc}")
