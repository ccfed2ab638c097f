"""Head-to-head table from one sitting's raw outputs: llama-bench JSON and our bench_offload JSON.

The device time of one session does not pay for h2h_llama.py's fresh process per round at 32k
prompt tokens, so the sitting runs each configuration once in its own process with repetitions
inside it (llama-bench `-r N` after its warm-up; bench_offload `--runs N` after a discarded
warm-up) and this script joins them: prefill tok/s per prompt length and decode tok/s per context
depth, median with min and max over the repetitions, PCIe bytes per prompt in expert sets (ours
counted, llama.cpp's analytic: with routed experts in host memory and op offload on, every
micro-batch of 32 tokens or more copies each layer's whole expert tensors to the card), and the
ratios ours / llama.cpp of the medians.

    python -m scripts.bench.h2h_table --llama l512.json l2048.json --ours-prefill p.json --ours-decode d.json \\
        --commands commands.txt --out h2h.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def llama_rows(tests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """llama-bench tests -> {"pp 2048 ub512": {...}, "tg 32 @8192 ub2048": {...}} with tok/s spread per test."""
    rows = {}
    for t in tests:
        ub = int(t["n_ubatch"])
        if int(t["n_gen"]) == 0:
            key = f"prefill {int(t['n_prompt'])} ub{ub}"
        else:
            key = f"decode @{int(t.get('n_depth', 0))} ub{ub}"
        rows[key] = {"tok_s": spread([float(x) for x in t["samples_ts"]]), "n_threads": t.get("n_threads"),
                     "overrides": t.get("tensor_buft_overrides"), "n_cpu_moe": t.get("n_cpu_moe"),
                     "ubatch": ub, "n_prompt": int(t["n_prompt"]), "n_gen": int(t["n_gen"]),
                     "n_depth": int(t.get("n_depth", 0))}
    return rows


def table(llama: dict[str, dict[str, Any]], ours_prefill: dict[str, Any] | None,
          ours_decode: dict[str, Any] | None) -> dict[str, Any]:
    """Per prompt length and context depth: both arms' figures and ours / llama.cpp per llama.cpp micro-batch."""
    out: dict[str, Any] = {"prefill": {}, "decode": {}}
    set_bytes = ours_prefill.get("expert_set_bytes") if ours_prefill else None
    for n, ours in (ours_prefill or {}).get("lengths", {}).items():
        n = int(n)
        row: dict[str, Any] = {"ours": {"tok_s": ours["prefill_tok_s"], "ttft_s": ours["ttft_s"],
                                        "expert_sets": ours["expert_sets"]["median"]}, "llama.cpp": {}, "ratio": {}}
        for key, theirs in llama.items():
            if key.startswith("prefill ") and theirs["n_prompt"] == n:
                ub = theirs["ubatch"]
                row["llama.cpp"][f"ub{ub}"] = {"tok_s": theirs["tok_s"],
                                               "expert_sets_analytic": float(math.ceil(n / ub))}
                row["ratio"][f"ours / llama.cpp ub{ub}"] = ours["prefill_tok_s"]["median"] / theirs["tok_s"]["median"]
        out["prefill"][n] = row
    for depth, ours in (ours_decode or {}).get("contexts", {}).items():
        depth = int(depth)
        row = {"ours": {"tok_s": ours["decode_tok_s"], "hit_rate": ours["hit_rate"]["median"]}, "llama.cpp": {},
               "ratio": {}}
        for key, theirs in llama.items():
            if key.startswith("decode ") and theirs["n_depth"] == depth:
                ub = theirs["ubatch"]
                row["llama.cpp"][f"ub{ub}"] = {"tok_s": theirs["tok_s"]}
                row["ratio"][f"ours / llama.cpp ub{ub}"] = ours["decode_tok_s"]["median"] / theirs["tok_s"]["median"]
        out["decode"][depth] = row
    out["expert_set_bytes"] = set_bytes
    return out


def markdown(t: dict[str, Any]) -> str:
    lines = ["| figure | ours median (min-max) | llama.cpp median (min-max) | ours / llama.cpp |", "|---|---|---|---|"]

    def fmt(s: dict[str, float]) -> str:
        return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"

    for kind, unit in (("prefill", "prompt tokens"), ("decode", "context")):
        for n, row in t[kind].items():
            for label, theirs in row["llama.cpp"].items():
                ratio = row["ratio"][f"ours / llama.cpp {label}"]
                lines.append(f"| {kind} tok/s, {n} {unit}, llama.cpp {label} | {fmt(row['ours']['tok_s'])} | "
                             f"{fmt(theirs['tok_s'])} | {ratio:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama", nargs="+", type=Path, default=[], help="llama-bench -o json outputs")
    ap.add_argument("--ours-prefill", type=Path)
    ap.add_argument("--ours-decode", type=Path)
    ap.add_argument("--commands", type=Path, help="the commands as run, one per line")
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    llama: dict[str, dict[str, Any]] = {}
    for path in args.llama:
        llama.update(llama_rows(json.loads(path.read_text())))
    prefill = json.loads(args.ours_prefill.read_text()) if args.ours_prefill else None
    decode = json.loads(args.ours_decode.read_text()) if args.ours_decode else None
    t = table(llama, prefill, decode)
    record = {"benchmark": "h2h_llama_in_process", "model": args.model, "table": t, "llama_rows": llama,
              "ours_environment": (prefill or decode or {}).get("environment"),
              "commands": args.commands.read_text().splitlines() if args.commands else None,
              "note": "each configuration ran once in its own process with repetitions inside it; llama.cpp's "
                      "PCIe figure is analytic (whole expert tensors per micro-batch), ours is counted"}
    args.out.write_text(json.dumps(record, indent=1, default=str))
    print(markdown(t))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
