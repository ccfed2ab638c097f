"""Phase-split client benchmark against `runner serve` (shared/MEASURING.md); writes JSON.

Every measured request is a cold, unique prompt of exactly --prompt-tokens tokens (a random nonce
first, and `cache_prompt: false` so not even the BOS token comes from the KV cache), sent as token ids to /v1/completions with streaming, token ids
and usage. Per request: the client's time to first token and decode rate ((n - 1) / (last token -
first token)), token ids counted and checked against usage.completion_tokens, and the server's own
split from /metrics deltas, used only when runner_generations_total moved by exactly one. Warm-ups
are discarded; the summary is the median with min and max of at least 5 runs.

    python -m scripts.bench.bench_serve --url http://127.0.0.1:8080 --prompt-tokens 2048 --gen 64 --out bench.json
    python -m scripts.bench.bench_serve --serve "MODEL.gguf --profile home-24g" --out bench.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

METRIC_LINE = re.compile(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$")
SERVER_FIGURES = {  # figure -> the /metrics sample whose delta gives it
    "ttft_s": "runner_time_to_first_token_seconds_sum", "prefill_s": "runner_prefill_seconds_sum",
    "decode_s": "runner_decode_seconds_sum", "completion_tokens": "runner_completion_tokens_total",
    "prompt_tokens": "runner_prompt_tokens_total", "bytes_uploaded": "runner_expert_bytes_uploaded_total",
    "prefill_bytes": "runner_prefill_expert_bytes_total", "cache_hits": "runner_expert_cache_hits_total",
    "cache_misses": "runner_expert_cache_misses_total", "drafted": "runner_draft_tokens_total",
    "accepted": "runner_draft_tokens_accepted_total", "phase_begins": "runner_phase_begin_total",
}
WORDS = "expert layer slot cache stream prompt token route host device copy kernel batch phase".split()


class BenchError(Exception):
    """A measurement that cannot be trusted: stop loudly."""


class Client:
    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600):
        u = urlsplit(url)
        self.host, self.port, self.timeout_s = u.hostname or "127.0.0.1", u.port or 80, timeout_s
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def _conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)

    def get(self, path: str) -> str:
        conn = self._conn()
        conn.request("GET", path, headers=self.headers)
        r = conn.getresponse()
        body = r.read().decode()
        if r.status != 200:
            raise BenchError(f"GET {path}: {r.status} {body[:200]}")
        return body

    def post(self, path: str, body: dict[str, Any]) -> Any:
        conn = self._conn()
        conn.request("POST", path, body=json.dumps(body), headers=self.headers)
        r = conn.getresponse()
        if r.status != 200:
            raise BenchError(f"POST {path}: {r.status} {r.read().decode()[:300]}")
        return r

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in self.get("/metrics").splitlines():
            m = METRIC_LINE.match(line)
            if m and not line.startswith("#"):
                out[m[1] + (m[2] or "")] = float(m[3])
        return out


def unique_prompt(client: Client, n_tokens: int, rng: random.Random) -> list[int]:
    """Exactly n_tokens ids of text that starts with a random nonce (tokenized by the server's own model)."""
    nonce = f"{rng.getrandbits(64):016x} " + " ".join(rng.choice(WORDS) for _ in range(8))
    text = nonce
    while True:
        ids = json.loads(client.post("/tokenize", {"content": text, "add_special": True}).read())["tokens"]
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
        text += " " + " ".join(rng.choice(WORDS) for _ in range(max(16, n_tokens - len(ids))))


def one_request(client: Client, prompt: list[int], gen: int) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": gen, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True,
            "cache_prompt": False}
    before = client.metrics()
    t0 = time.perf_counter()
    r = client.post("/v1/completions", body)
    chunks: list[tuple[float, dict[str, Any]]] = []
    while line := r.readline():
        line = line.strip()
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            chunks.append((time.perf_counter(), json.loads(line[6:])))
    after = client.metrics()
    return _figures(chunks, t0, before, after, len(prompt))


def _figures(chunks: list[tuple[float, dict]], t0: float, before: dict, after: dict, n_prompt: int) -> dict:
    token_times, n_tokens, usage, timings = [], 0, None, None
    content = [(t, c) for t, c in chunks if c.get("choices")]
    for i, (t, c) in enumerate(content):
        choice = c["choices"][0]
        ids = choice.get("token_ids") or []
        # A text-only chunk is legal only as the detokenizer's flush just before the end.
        if choice.get("text") and not ids and i < len(content) - 2:
            raise BenchError("visible text arrived without token ids: cannot count tokens")
        if ids:
            token_times.append(t)
            n_tokens += len(ids)
        timings = c.get("timings", timings)
    for _, c in chunks:
        usage = c.get("usage") or usage
    if usage is None:
        raise BenchError("no usage chunk: the server ignored stream_options.include_usage")
    if n_tokens != usage["completion_tokens"] or usage["prompt_tokens"] != n_prompt:
        raise BenchError(f"counted {n_tokens} token ids and {n_prompt} prompt tokens, usage says "
                         f"{usage['completion_tokens']} and {usage['prompt_tokens']}")
    if timings is not None and timings.get("cached_n"):
        raise BenchError(f"the server reused {timings['cached_n']} cached prompt tokens: the prompt was not cold")
    delta = {k: after.get(v, 0.0) - before.get(v, 0.0) for k, v in SERVER_FIGURES.items()}
    generations = after.get("runner_generations_total", 0.0) - before.get("runner_generations_total", 0.0)
    if generations != 1:
        raise BenchError(f"runner_generations_total moved by {generations} during one request: another client "
                         f"shares the server, so its /metrics cannot be attributed")
    if delta["completion_tokens"] != n_tokens:
        raise BenchError(f"/metrics counted {delta['completion_tokens']} completion tokens, the client {n_tokens}")
    first, last = token_times[0], token_times[-1]
    client_ttft = first - t0
    return {
        "prompt_tokens": n_prompt, "completion_tokens": n_tokens,
        "client": {"ttft_s": client_ttft, "prefill_tok_s": n_prompt / client_ttft,
                   "decode_s": last - first, "decode_tok_s": (n_tokens - 1) / (last - first) if last > first else None},
        "server": {**delta, "prefill_tok_s": n_prompt / delta["prefill_s"] if delta["prefill_s"] > 0 else None,
                   "decode_tok_s": (n_tokens - 1) / delta["decode_s"] if delta["decode_s"] > 0 else None},
        "timings": timings,
        "clock_gap_ttft_s": client_ttft - delta["ttft_s"],  # client minus engine: HTTP, SSE and queue
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side in ("client", "server"):
        for key in runs[0][side]:
            values = [r[side][key] for r in runs if isinstance(r[side][key], (int, float))]
            if values:
                out[f"{side}.{key}"] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                                        "n": len(values)}
    return out


def start_server(spec: str, python: str) -> tuple[subprocess.Popen, str]:
    """A fresh `runner serve MODEL ...` on a free port; returns it and its base URL once it serves."""
    args = [python, "-m", "runner.cli", "serve", *shlex.split(spec), "--port", "0"]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        sys.stderr.write(line)
        if line.startswith("serving ") and " on http://" in line:
            # Keep draining its log, or a full pipe would block the server mid-benchmark.
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
            return proc, line.split(" on ", 1)[1].split()[0].removesuffix("/v1")
    raise BenchError(f"runner serve exited ({proc.wait()}) before serving: {' '.join(args)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server's base URL (it must serve this client alone)")
    where.add_argument("--serve", help="start a fresh `runner serve` with these arguments (MODEL and flags)")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=None, help="nonce seed (default: random)")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.runs < 5:
        ap.error("MEASURING.md: report the median of at least 5 runs")
    proc = None
    url = args.url
    if args.serve:
        proc, url = start_server(args.serve, sys.executable)
    try:
        client = Client(url, args.api_key)
        rng = random.Random(args.seed)
        props = json.loads(client.get("/props"))
        for _ in range(args.warmup):
            one_request(client, unique_prompt(client, args.prompt_tokens, rng), args.gen)
        runs = [one_request(client, unique_prompt(client, args.prompt_tokens, rng), args.gen) for _ in range(args.runs)]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    from runner.environment import environment

    out = {"benchmark": "bench_serve", "environment": environment(), "server": {"url": url, "props": props},
           "args": vars(args), "prompt_tokens": args.prompt_tokens, "gen": args.gen, "context_depth": args.prompt_tokens,
           "warmups_discarded": args.warmup, "runs": runs, "summary": summarize(runs),
           "note": "random-weight models have no real routing locality: their cache figures are not a real model's"}
    write_record(args.out, out)
    s = out["summary"]
    for key in ("client.ttft_s", "server.ttft_s", "client.prefill_tok_s", "client.decode_tok_s", "server.bytes_uploaded"):
        if key in s:
            print(f"{key:24} median {s[key]['median']:.4g}  min {s[key]['min']:.4g}  max {s[key]['max']:.4g}")
    print(f"wrote {args.out}")


def write_record(path: str | Path, out: dict) -> None:
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def run_main(main: Callable[[], None]) -> None:
    """main(), a BenchError ending the process with its one line."""
    try:
        main()
    except BenchError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    run_main(main)
