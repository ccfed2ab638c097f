"""A/B driver (shared/MEASURING.md 3-5): two configurations in alternation, each run a fresh process; ratios.

Each arm is a command line that writes one JSON object: to the file named by a `{out}` placeholder
in the command, or as the last line of its stdout. The driver runs A B A B ... (--rounds pairs,
after --warmup discarded pairs), reads the named figures (dotted paths into the JSON, e.g.
`ttft_s` or `summary.client.ttft_s.median`), and reports per arm the median, min and max, the ratio
B/A of the medians and the per-pair ratios' range. A difference smaller than the spread between
identical runs is not a result: run the A/A control (--a and --b the same) to see that spread.

    python -m scripts.bench.ab --a "runner profile M.gguf --prompt-file doc.txt --json {out}" \
        --b "runner profile M.gguf --prompt-file doc.txt --prefill-order per_microbatch --json {out}" \
        --metric ttft_s --metric prefill.stream_bytes --out ab.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.bench.common import summary


class ABError(Exception):
    pass


def run_arm(command: str, workdir: Path, tag: str) -> tuple[dict[str, Any], float]:
    """Run one arm's command in a fresh process; its JSON and the wall seconds it took."""
    out = workdir / f"{tag}.json"
    args = [a.replace("{out}", str(out)) for a in shlex.split(command)]
    t0 = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True)
    wall_s = time.perf_counter() - t0
    if done.returncode != 0:
        raise ABError(f"`{' '.join(args)}` exited {done.returncode}: {done.stderr.strip().splitlines()[-1:] or ''}")
    text = out.read_text() if "{out}" in command else (done.stdout.strip().splitlines() or [""])[-1]
    try:
        return json.loads(text), wall_s
    except json.JSONDecodeError as exc:
        raise ABError(f"`{' '.join(args)}` wrote no JSON object ({exc})") from None


def figure(data: Any, path: str) -> float:
    for key in path.split("."):
        if isinstance(data, list):
            data = data[int(key)]
        elif isinstance(data, dict) and key in data:
            data = data[key]
        else:
            raise ABError(f"no figure '{path}' in the arm's JSON (missing '{key}')")
    if not isinstance(data, (int, float)) or isinstance(data, bool):
        raise ABError(f"figure '{path}' is {data!r}, not a number")
    return float(data)


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]], metrics: list[str]) -> dict[str, Any]:
    out = {}
    for m in metrics:
        va, vb = [figure(x, m) for x in a], [figure(x, m) for x in b]
        pairs = [y / x for x, y in zip(va, vb) if x]
        ma, mb = statistics.median(va), statistics.median(vb)
        out[m] = {"a": summary(va), "b": summary(vb), "ratio_b_over_a": mb / ma if ma else None,
                  "pair_ratios": summary(pairs) if pairs else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="arm A's command ({out}: where it writes JSON)")
    ap.add_argument("--b", required=True, help="arm B's command")
    ap.add_argument("--metric", action="append", required=True, help="dotted path to a number in the JSON")
    ap.add_argument("--rounds", type=int, default=5, help="measured A B pairs (at least 5)")
    ap.add_argument("--warmup", type=int, default=1, help="A B pairs run first and discarded")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.rounds < 5:
        ap.error("MEASURING.md: at least 5 rounds")
    results: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    walls: dict[str, list[float]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        for i in range(args.warmup + args.rounds):
            for arm in ("a", "b"):  # alternation: drift over the sitting hits both arms alike
                data, wall_s = run_arm(getattr(args, arm), Path(tmp), f"{arm}{i}")
                for m in args.metric:  # a missing figure stops the sitting at once, not after every round
                    figure(data, m)
                if i >= args.warmup:
                    results[arm].append(data)
                    walls[arm].append(wall_s)
                print(f"round {i}{' (warm-up)' if i < args.warmup else ''} {arm}: {wall_s:.1f} s", file=sys.stderr)
    from runner.environment import environment

    comparison = compare(results["a"], results["b"], args.metric)
    out = {"benchmark": "ab", "environment": environment(), "a": {"label": args.label_a, "command": args.a},
           "b": {"label": args.label_b, "command": args.b}, "rounds": args.rounds, "warmups_discarded": args.warmup,
           "order": "A B alternating, each run a fresh process", "comparison": comparison,
           "process_wall_s": {k: summary(v) for k, v in walls.items()}, "runs": results}
    Path(args.out).write_text(json.dumps(out, indent=1))
    for m, c in comparison.items():
        ratio = f"{c['ratio_b_over_a']:.3f}" if c["ratio_b_over_a"] is not None else "-"
        pr = c["pair_ratios"]
        print(f"{m}: {args.label_a} {c['a']['median']:.4g} [{c['a']['min']:.4g}, {c['a']['max']:.4g}]  "
              f"{args.label_b} {c['b']['median']:.4g} [{c['b']['min']:.4g}, {c['b']['max']:.4g}]  "
              f"B/A {ratio}" + (f" (pairs {pr['min']:.3f}..{pr['max']:.3f})" if pr else ""))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    try:
        main()
    except ABError as exc:
        sys.exit(f"error: {exc}")
