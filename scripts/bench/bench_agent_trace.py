"""Agent-trace serving benchmark (issue 24 item 6): interleaved growing conversations; writes JSON.

A seeded trace of --conversations conversations, each a long system prompt and a task, growing by one
tool-call-like exchange per turn (a scripted assistant turn calling a tool, then the tool's result as a
user turn), so each request's prompt repeats the previous prompt of its conversation and adds about
--growth of it in characters (default 5%: about 95% reusable, as coding agents' traffic). The
conversations are sent interleaved, A B C A B C ..., to /v1/chat/completions with streaming, so a
server with one live KV cache re-prefills each switch unless it keeps other conversations' prompts
(runner serve's and llama-server's --cache-ram). The assistant turns are the trace's, never the
model's replies, so the very same prompts (the exact messages are in the JSON) go to any server.

Per request: the client's time to first token and decode rate ((completion_tokens - 1) / (last chunk -
first chunk), completion_tokens from usage), prompt tokens, reused tokens and restored tokens, read from
whichever of usage.prompt_tokens_details.cached_tokens (OpenAI), timings.cache_n (llama-server; also
runner serve) and timings.cache_restored_n (runner serve) the server sends, and which one was used.
Warm-ups (--warmup, a nonce prompt) are discarded. Summary per turn index and overall: median, min,
max. The first turn of each conversation is its cold prefill. Run each server alone, one after the
other, with the same --seed (and the same model file): the same prompts.

    python -m scripts.bench.bench_agent_trace --url http://127.0.0.1:8080 --seed 1 --out trace.json
    python -m scripts.bench.bench_agent_trace --serve "MODEL.gguf --profile home-24g --cache-ram 16" --seed 1 --out ours.json
    llama-server -m MODEL.gguf --jinja -c 32768 --cache-ram 16384 --port 8081 &
    python -m scripts.bench.bench_agent_trace --url http://127.0.0.1:8081 --seed 1 --out llama.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any

from scripts.bench.bench_serve import BenchError, Client, run_main, start_server, write_record

WORDS = ("file", "path", "function", "test", "error", "module", "import", "class", "return", "value", "config",
         "build", "patch", "diff", "line", "branch", "commit", "review", "search", "replace", "parse", "token",
         "cache", "request", "server", "client")
TOOLS = ("read_file", "grep", "run_tests", "apply_patch", "list_dir")


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def build_trace(seed: int, conversations: int, turns: int, system_words: int, growth: float) -> list[dict[str, Any]]:
    """The requests in send order: each {conversation, turn, messages}; turn t's messages extend turn t-1's."""
    rng = random.Random(seed)
    convs: list[list[dict[str, str]]] = []
    for c in range(conversations):
        system = f"You are coding agent {c} ({rng.getrandbits(32):08x}). Tools: {', '.join(TOOLS)}. " + _text(
            rng, system_words)
        convs.append([{"role": "system", "content": system},
                      {"role": "user", "content": f"Task {c}: " + _text(rng, 24)}])
    trace = []
    for turn in range(turns):
        for c, messages in enumerate(convs):
            if turn > 0:  # one exchange of about `growth` of the prompt so far (in characters), call and result
                target = growth * sum(len(m["content"]) for m in messages)
                args = json.dumps({"path": f"src/{rng.choice(WORDS)}.py", "query": _text(rng, 3)})
                call = f'<tool_call>{{"name": "{rng.choice(TOOLS)}", "arguments": {args}}}</tool_call>'
                result = "Tool result:"
                while len(call) + len(result) < target:
                    result += " " + rng.choice(WORDS)
                messages.append({"role": "assistant", "content": call})
                messages.append({"role": "user", "content": result})
            trace.append({"conversation": c, "turn": turn, "messages": [dict(m) for m in messages]})
    return trace


def reuse_of(usage: dict[str, Any], timings: dict[str, Any] | None) -> dict[str, Any]:
    """Reused and restored prompt tokens from whichever fields the server sent, and which they were."""
    details = usage.get("prompt_tokens_details") or {}
    timings = timings or {}
    if "cached_tokens" in details:
        cached, source = details["cached_tokens"], "usage.prompt_tokens_details.cached_tokens"
    elif "cache_n" in timings:
        cached, source = timings["cache_n"], "timings.cache_n"
    else:
        cached, source = None, None
    restored = timings.get("cache_restored_n")
    return {"cached_tokens": cached, "cached_source": source, "restored_tokens": restored,
            "restored_source": "timings.cache_restored_n" if restored is not None else None,
            "timings_cache_n": timings.get("cache_n")}


def one_request(client: Client, model: str, messages: list[dict[str, str]], gen: int) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "max_tokens": gen, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    r = client.post("/v1/chat/completions", body)
    first = last = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    while line := r.readline():
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        now, chunk = time.perf_counter(), json.loads(line[6:])
        delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
            first = first if first is not None else now
            last = now
        usage = chunk.get("usage") or usage
        timings = chunk.get("timings") or timings
    if usage is None:
        raise BenchError("no usage chunk: the server ignored stream_options.include_usage")
    if first is None or last is None:
        raise BenchError("no content arrived: cannot time the first token")
    n = usage["completion_tokens"]
    return {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": n, **reuse_of(usage, timings),
            "client": {"ttft_s": first - t0, "decode_s": last - first,
                       "decode_tok_s": (n - 1) / (last - first) if last > first and n > 1 else None},
            "timings": timings}


FIGURES = ("client.ttft_s", "client.decode_tok_s", "prompt_tokens", "cached_tokens", "restored_tokens", "reused_share")


def _figure(run: dict[str, Any], key: str) -> Any:
    if key == "reused_share":
        return run["cached_tokens"] / run["prompt_tokens"] if run["cached_tokens"] is not None else None
    side, _, name = key.rpartition(".")
    return (run[side] if side else run).get(name)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in FIGURES:
        values = [v for r in runs if isinstance(v := _figure(r, key), (int, float))]
        if values:
            out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server's base URL (runner serve or llama-server; this client alone)")
    where.add_argument("--serve", help="start a fresh `runner serve` with these arguments (MODEL and flags)")
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--turns", type=int, default=8, help="requests per conversation")
    ap.add_argument("--system-words", type=int, default=1500, help="words of each conversation's system prompt")
    ap.add_argument("--growth", type=float, default=0.05, help="each turn adds this share of the prompt so far (characters)")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0, help="the trace's seed: the same seed, the same prompts")
    ap.add_argument("--warmup", type=int, default=1, help="discarded requests first, sharing no prompt with the trace")
    ap.add_argument("--model", default="default", help="the request's model name")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    trace = build_trace(args.seed, args.conversations, args.turns, args.system_words, args.growth)
    proc, url = (start_server(args.serve, sys.executable) if args.serve else (None, args.url))
    try:
        client = Client(url, args.api_key)
        try:
            props = json.loads(client.get("/props"))
        except (BenchError, ValueError) as exc:
            props = {"error": str(exc)}
        for i in range(args.warmup):
            warm = [{"role": "user", "content": f"Warm-up {random.Random().getrandbits(64):016x} {i}: say hello."}]
            one_request(client, args.model, warm, args.gen)
        runs = [{"conversation": t["conversation"], "turn": t["turn"], **one_request(client, args.model, t["messages"],
                                                                                     args.gen)} for t in trace]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    from runner.environment import environment

    per_turn = {str(t): summarize([r for r in runs if r["turn"] == t]) for t in range(args.turns)}
    out = {"benchmark": "bench_agent_trace", "environment": environment(), "server": {"url": url, "props": props},
           "args": vars(args), "warmups_discarded": args.warmup, "trace": trace, "runs": runs,
           "reuse_fields": sorted({f for r in runs for f in (r["cached_source"], r["restored_source"]) if f}), "summary": {"overall": summarize(runs),
                                                                        "per_turn": per_turn,
                                                                        "after_first_turn": summarize(
                                                                            [r for r in runs if r["turn"] > 0])},
           "note": "turn 0 of each conversation is a cold prefill; later turns measure reuse across switches. "
                   "Random-weight models have no real routing locality: their cache figures are not a real model's"}
    write_record(args.out, out)
    for t, s in per_turn.items():
        fig = " ".join(f"{k} {s[k]['median']:.4g}" for k in ("client.ttft_s", "prompt_tokens", "cached_tokens") if k in s)
        print(f"turn {t}: median {fig}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_main(main)
