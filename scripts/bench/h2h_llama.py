"""Head-to-head with llama.cpp on one box (shared/MEASURING.md); writes JSON with every command as run.

llama.cpp's arm is its own `llama-bench` (given by path), experts kept in host memory the two ways
llama.cpp users do it, `-ot exps=CPU` and `--n-cpu-moe N`, at micro-batch 512 and 2048: prompt
processing of --prompt-tokens (pp) and generation of --gen tokens at a context depth of
--prompt-tokens (tg, `-d`). Our arm is `runner profile` with the home-24g profile (and any more
`--ours LABEL=ARGS` arms): prefill tok/s = prompt tokens / time to first token, decode tok/s as
the profile reports it, after --our-warmup unreported prompts of the same length (default 1: llama-bench
warms up with a whole prompt of its -p before it measures; 0 measures our first request of a process). Every
configuration runs once per round, in a fresh process, the rounds alternating the arms (at least 3), and
measures --repeats times in that process (llama-bench -r, our profile --repeat), at least 5 runs an arm in
all; the summary is the median over every run with min and max, and our / llama.cpp ratios of the medians.
Several prompt lengths (--prompt-tokens 2048,8192,32768) run in every process, shortest first, as llama-bench
runs its -p list: a configuration still gets its own processes, and each length its own summary row. Our
processes report a digest of each run's generated tokens (profile's `tokens_sha256`); `same_tokens` says, per arm,
whether every process generated the first of our arms' tokens run by run (an A/B that should keep the bits).

    python -m scripts.bench.h2h_llama MODEL.gguf --llama-bench ~/llama.cpp/build/bin/llama-bench --out h2h.json
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

FILLER = ("Routed experts live in host memory and cross the bus to the card when a layer needs them; "
          "the cache keeps the ones decode uses most. ")


class H2HError(Exception):
    pass


def llama_arms(args: argparse.Namespace) -> dict[str, list[str]]:
    """label -> llama-bench argv (--repeats repetitions in one process; the driver repeats across rounds)."""
    arms = {}
    for ub in args.ubatch:
        for style, flags in (("ot-exps-cpu", ["-ot", "exps=CPU"]), ("n-cpu-moe", ["--n-cpu-moe", str(args.n_cpu_moe)]),
                             ("resident", [])):  # resident: every weight on the GPU (the kernels alone, no link)
            if style not in args.styles:
                continue
            common = [args.llama_bench, "-m", args.model, "-ngl", "99", "-b", str(max(ub, 2048)),
                      "-ub", str(ub), *flags, "-r", str(args.repeats), "-o", "json", *shlex.split(args.llama_extra)]
            lengths = ",".join(map(str, args.prompt_tokens))  # llama-bench runs every length in one process
            if not args.tg_only:
                arms[f"llama.cpp {style} ub{ub} pp"] = [*common, "-p", lengths, "-n", "0"]
            if args.pp_only:
                continue
            depth = [] if args.no_depth else ["-d", lengths]
            arms[f"llama.cpp {style} ub{ub} tg"] = [*common, "-p", "0", "-n", str(args.gen), *depth]
    return arms


def our_arms(args: argparse.Namespace, prompt_file: Path, out_dir: Path) -> dict[str, list[str]]:
    arms = {}
    runners = dict(spec.partition("=")[::2] for spec in args.ours_runner)
    unknown = set(runners) - {spec.partition("=")[0] for spec in args.ours}
    if unknown:
        raise H2HError(f"--ours-runner names no --ours arm: {', '.join(sorted(unknown))}")
    for spec in args.ours:
        label, _, flags = spec.partition("=")
        lengths = [a for n in args.prompt_tokens for a in ("--prompt-tokens", str(n))]
        runner = runners.get(label, args.runner)
        arms[f"ours {label}"] = [*shlex.split(runner), "profile", args.model, "--prompt-file", str(prompt_file),
                                 *lengths, "--gen", str(args.gen), "--warmup", str(args.our_warmup),
                                 "--repeat", str(args.repeats),
                                 *shlex.split(flags),
                                 "--json", str(out_dir / "{out}")]
    return arms


def run(argv: list[str]) -> str:
    """Run once in a fresh process; its stdout."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        raise H2HError(f"`{shlex.join(argv)}` exited {done.returncode}: {' | '.join(tail)}")
    return done.stdout


def llama_figures(stdout: str) -> list[dict[str, float]]:
    """llama-bench -o json: a list of tests; pp gives prefill tok/s of its prompt length, tg decode tok/s at
    its depth (`prompt_tokens` either way), one figure per repetition (samples_ts)."""
    runs: list[dict[str, float]] = []
    for test in json.loads(stdout):
        pp = test["n_gen"] == 0
        key, n = ("prefill_tok_s", test["n_prompt"]) if pp else ("decode_tok_s", test.get("n_depth", 0))
        runs += [{"prompt_tokens": int(n), key: float(ts)} for ts in test.get("samples_ts") or [test["avg_ts"]]]
    return runs


def our_figures(report: dict[str, Any]) -> list[dict[str, float]]:
    """One figure set per measured prompt of the process (profile --repeat: `runs`)."""
    runs = report.get("runs") or [{"ttft_s": report["ttft_s"], "prefill_tok_s": report["prefill_tok_s"],
                                   "decode_tok_s": report["decode"]["decode_tok_s"],
                                   "uploaded_expert_sets": report["prefill"]["uploaded_expert_sets"]}]
    n = report["prompt"]["tokens"]  # a report of one length (its runs say theirs when there are several)
    # a decoded token's GPU time in its graphs and the rest (host), where whole-step graphs ran (CUDA directory
    # or resident); absent otherwise
    split = ("decode_gpu_ms_per_token", "decode_host_ms_per_token")
    return [{"prompt_tokens": r.get("prompt_tokens", n), "prefill_tok_s": r["prefill_tok_s"],
             "decode_tok_s": r["decode_tok_s"], "ttft_s": r["ttft_s"], "prefill_expert_sets": r["uploaded_expert_sets"],
             **{k: r[k] for k in split if r.get(k) is not None}}
            for r in runs]


def our_tokens(report: dict[str, Any]) -> list[str | None]:
    """One process's generated-token digests, a run each in the order its prompts ran (None: a report without)."""
    runs = report.get("runs") or [report.get("decode", {})]
    return [r.get("tokens_sha256") for r in runs]


def same_tokens(tokens: dict[str, list[list[str | None]]]) -> dict[str, bool]:
    """Per arm after the first of ours: whether every process generated, run by run, the first arm's tokens (of its
    first process; the same prompts run in the same order in every process). Arms without digests are left out."""
    known = {label: procs for label, procs in tokens.items() if procs and all(None not in p for p in procs)}
    if not known:
        return {}
    first, *others = known
    want = known[first][0]
    return {label: all(p == want for p in known[label]) for label in [first, *others]}


def by_length(label: str, figures: list[dict[str, float]], lengths: list[int]) -> dict[str, list[dict[str, float]]]:
    """One process's figures under its arm's label, or under "LABEL @N" per prompt length when there are several."""
    out: dict[str, list[dict[str, float]]] = {}
    for f in figures:
        n = f.pop("prompt_tokens")
        out.setdefault(label if len(lengths) == 1 else f"{label} @{n}", []).append(f)
    return out


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--llama-bench", required=True, help="path to llama.cpp's llama-bench binary")
    ap.add_argument("--runner", default=f"{sys.executable} -m runner.cli", help="how to start our runner")
    ap.add_argument("--ours", action="append", default=None,
                    help="LABEL=ARGS for `runner profile` (default: home-24g=--profile home-24g); repeatable")
    ap.add_argument("--ours-runner", action="append", default=[],
                    help="LABEL=CMD: start that arm's runner with CMD instead of --runner (an A/B of a patch in "
                         "another copy of the tree, arms alternated in the same rounds); repeatable")
    ap.add_argument("--prompt-tokens", type=lambda v: sorted({int(n) for n in v.split(",")}), default=[2048],
                    help="prompt length, or several (2048,8192,32768): every process runs each, shortest first, and "
                         "the summary has one row per arm and length [default: 2048]")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--ubatch", type=int, action="append", default=None, help="llama.cpp micro-batch (512, 2048)")
    ap.add_argument("--n-cpu-moe", type=int, default=99, help="layers whose experts stay on the CPU (99: all)")
    # -lm none (llama.cpp's load-mode flag in the llama-cpp-python 0.3.36 sources): no mmap, so the host
    # experts sit in a pinned buffer; mmap'd pages are pageable and cross at about an eighth of the rate
    # (6.5 vs 55 GB/s on the H200 box).
    ap.add_argument("--llama-extra", default="-fa 1 -lm none", help="more llama-bench flags [default: -fa 1 -lm none]")
    ap.add_argument("--no-depth", action="store_true", help="the llama-bench build has no -d: tg at depth 0")
    ap.add_argument("--styles", default="ot-exps-cpu,n-cpu-moe", type=lambda v: v.split(","),
                    help="llama.cpp's ways of keeping experts on the CPU to run, or resident (all on the GPU) "
                         "[default: ot-exps-cpu,n-cpu-moe]")
    ap.add_argument("--our-warmup", type=int, default=1,
                    help="unreported prompts our arms run first (llama-bench warms up with one) [default: 1]")
    ap.add_argument("--pp-only", action="store_true", help="llama.cpp's prompt processing only (no tg arms)")
    ap.add_argument("--tg-only", action="store_true",
                    help="llama.cpp's generation only (no pp arms: a decode comparison spends no time on them)")
    ap.add_argument("--prompt-file", default=None, help="our arm's prompt text (default: a filler paragraph)")
    ap.add_argument("--rounds", type=int, default=5, help="fresh processes per arm, alternated [default: 5]")
    ap.add_argument("--repeats", type=int, default=1, help="measured runs in each process [default: 1]")
    ap.add_argument("--keep-reports", default=None, metavar="DIR",
                    help="keep every process's own report here (our profile JSON with its timeline, llama-bench's JSON)")
    ap.add_argument("--dry-run", action="store_true", help="write the commands, run nothing")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no process that, as long as its arm's longest so far, would end past S seconds")
    ap.add_argument("--resume", action="store_true",
                    help="go on with an unfinished record of the same benchmark at --out (a call cut by its limit)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    args.ours = args.ours or ["home-24g=--profile home-24g"]
    args.ubatch = args.ubatch or [512, 2048]
    if args.pp_only and args.tg_only:
        ap.error("--pp-only and --tg-only leave llama.cpp no arm: give one of them")
    if not args.dry_run and (args.rounds < 3 or args.rounds * args.repeats < 5):
        ap.error("MEASURING.md: at least 3 processes an arm and at least 5 runs (--rounds x --repeats)")
    with tempfile.TemporaryDirectory(prefix="h2h-") as tmp:
        work = Path(tmp)
        prompt_file = Path(args.prompt_file) if args.prompt_file else work / "prompt.txt"
        if not args.prompt_file:
            prompt_file.write_text(FILLER * (max(args.prompt_tokens) // 8 + 1))
        arms = {**llama_arms(args), **our_arms(args, prompt_file, work)}
        ran: dict[str, list[list[str]]] = {label: [] for label in arms}
        figures: dict[str, list[dict[str, float]]] = {}
        seconds: dict[str, list[float]] = {label: [] for label in arms}
        tokens: dict[str, list[list[str | None]]] = {}  # ours: each process's generated-token digests
        if args.resume:
            ran, figures, seconds, tokens = resumed(args, arms)
        start = time.monotonic()
        for i in range(0 if args.dry_run else args.rounds):
            for n, (label, argv) in enumerate(arms.items()):  # one of each per round: the arms alternate
                if len(ran[label]) > i:  # ran before --resume
                    continue
                if args.budget_s is not None and time.monotonic() - start + max(seconds[label], default=0) > args.budget_s:
                    print(f"stopped before round {i} of {label}: its longest process would pass --budget-s "
                          f"{args.budget_s:g}; --resume goes on", file=sys.stderr)
                    return
                out_path = work / f"round{i}-arm{n}.json"
                argv_run = [a.replace("{out}", out_path.name) for a in argv]
                t0 = time.monotonic()
                stdout = run(argv_run)
                seconds[label].append(time.monotonic() - t0)
                ran[label].append(argv_run)
                ours = label.startswith("ours ")
                report = out_path.read_text() if ours else stdout
                got = by_length(label, our_figures(json.loads(report)) if ours else llama_figures(report),
                                args.prompt_tokens)
                for key, figs in got.items():
                    figures.setdefault(key, []).extend(figs)
                if ours:
                    tokens.setdefault(label, []).append(our_tokens(json.loads(report)))
                if args.keep_reports:
                    keep = Path(args.keep_reports)
                    keep.mkdir(parents=True, exist_ok=True)
                    (keep / f"{'-'.join(label.split())}-round{i}.json").write_text(report)
                print(f"round {i} {label}: {got}", file=sys.stderr)
                write_record(args, arms, ran, figures, seconds, tokens, complete=False)  # a time limit keeps what ran
    out = write_record(args, arms, ran, figures, seconds, tokens, complete=True)
    for label, cmd in out["commands"].items():
        print(f"{label}: {cmd}")
    for label, r in out["ratios"].items():
        print(f"{label}: {r:.3f}")
    first = next(iter(out["same_tokens"]), None)
    for label, same in list(out["same_tokens"].items())[1:]:
        print(f"{label}: {'the same tokens as' if same else 'tokens that DIFFER from'} {first}, run by run")
    print(f"wrote {args.out}")


# arguments that may change between a run and its --resume: where things go and how long this call may take
NOT_THE_BENCHMARK = ("resume", "budget_s", "out", "keep_reports", "dry_run")


def resumed(args: argparse.Namespace, arms: dict[str, list[str]]) -> tuple[dict, dict, dict, dict]:
    """What an unfinished record of the same benchmark at args.out already ran: commands, figures, seconds, our
    token digests."""
    try:
        record = json.loads(Path(args.out).read_text())
    except (OSError, ValueError):
        return {label: [] for label in arms}, {}, {label: [] for label in arms}, {}
    mine = {k: v for k, v in vars(args).items() if k not in NOT_THE_BENCHMARK}
    theirs = {k: v for k, v in record.get("args", {}).items() if k not in NOT_THE_BENCHMARK}
    if record.get("complete") or theirs != mine or set(record.get("commands_as_run", {})) != set(arms):
        raise H2HError(f"--resume: {args.out} is {'complete' if record.get('complete') else 'another benchmark'}; "
                       f"give a new --out")
    seconds = record.get("seconds") or {label: [] for label in arms}
    return record["commands_as_run"], record["figures"], seconds, record.get("generated_tokens") or {}


def write_record(args: argparse.Namespace, arms: dict[str, list[str]], ran: dict[str, list[list[str]]],
                 figures: dict[str, list[dict[str, float]]], seconds: dict[str, list[float]],
                 tokens: dict[str, list[list[str | None]]], complete: bool) -> dict:
    """The record so far into args.out: `complete` is false until every round of every arm has run."""
    from runner.environment import environment

    # every figure any process of the arm reported (the decode split comes only from whole-step graphs)
    summary = {label: {k: spread([f[k] for f in fs if k in f]) for k in dict.fromkeys(k for f in fs for k in f)}
               for label, fs in figures.items() if fs}
    out = {"benchmark": "h2h_llama", "complete": complete, "environment": environment(), "model": args.model,
           "args": vars(args), "commands": {label: shlex.join(argv) for label, argv in arms.items()},
           "commands_as_run": ran, "seconds": seconds, "figures": figures, "summary": summary,
           "ratios": _ratios(summary), "generated_tokens": tokens, "same_tokens": same_tokens(tokens),
           "note": "llama-bench prompt processing runs at depth 0 and generation at depth --prompt-tokens (-d); ours "
                   "decodes after its prompt. Random-weight models have no real routing locality."}
    Path(args.out).write_text(json.dumps(out, indent=1))
    return out


def _ratios(summary: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """ours / llama.cpp, median over median, for each of our arms against each llama.cpp configuration (of the
    same prompt length, where the rows are per length)."""
    out = {}
    for ours, figs in summary.items():
        if not ours.startswith("ours "):
            continue
        for label, theirs in summary.items():
            same_length = ours.rpartition(" @")[2] == label.rpartition(" @")[2] if " @" in ours else True
            for key in ("prefill_tok_s", "decode_tok_s"):
                if label.startswith("llama.cpp") and same_length and key in theirs and theirs[key]["median"]:
                    out[f"{ours} / {label} {key}"] = figs[key]["median"] / theirs[key]["median"]
    return out


if __name__ == "__main__":
    try:
        main()
    except H2HError as exc:
        sys.exit(f"error: {exc}")
