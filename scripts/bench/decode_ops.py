"""Where a decode token's time goes, op by op (issue 20: the GPU spends most of a token in kernels). Decode runs
eagerly here, without CUDA graphs, so every Ops method the model calls for a token can be bracketed by host
clocks and (on CUDA) by events on the compute stream, and every device-to-host copy the host waits on (the
router's ids under offload) is counted. A kernel's GPU time is the same inside a graph; what a graph removes
is the launch gaps, which show here as the token's wall time minus its ops' GPU time. Writes JSON
(shared/MEASURING.md: a benchmark, not a test).

    python -m scripts.bench.decode_ops MODEL.gguf --context 1024 --tokens 64 --slots 150 --out ops.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from scripts.bench import bench_offload
from scripts.bench.prefill_ops import Brackets, instrument

# What the models call per token (runner/models/*.py); decode_forward around them is the token itself.
OPS = ("embed", "rms_norm", "linear", "rope_kv_store", "kv_store", "attention", "swiglu", "swiglu_ffn", "route",
       "moe", "concat", "sigmoid", "rope_multi", "ssm_conv", "gated_delta_net", "delta_net_gates")


class OuterBrackets(Brackets):
    """Brackets that file an op called from inside another bracketed op (numpy's rope_kv_store calling kv_store)
    as "NAME (nested)", so the outer ops' times add up to the token's without counting anything twice."""

    depth: int = 0

    def wrap(self, name: str, fn: Any) -> Any:
        outer, nested = super().wrap(name, fn), super().wrap(f"{name} (nested)", fn)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.depth += 1
            try:
                return (nested if self.depth > 1 else outer)(*args, **kwargs)
            finally:
                self.depth -= 1
        return call


def per_token(ops: dict[str, dict[str, Any]], n: int) -> dict[str, dict[str, Any]]:
    """Each op's figures divided by the tokens: calls, host and GPU milliseconds a token."""
    return {name: {"calls": v["calls"] / n, "host_ms": 1e3 * v["host_s"] / n,
                   "gpu_ms": None if v["gpu_s"] is None else 1e3 * v["gpu_s"] / n} for name, v in ops.items()}


def queue_ahead(us: float) -> Callable[[], None]:
    """A launch of a spin of `us` microseconds at the GPU's clock (its rate read once)."""
    import cupy as cp

    from scripts.bench.common import spin_kernel

    spin = spin_kernel()
    cycles = np.int64(us * cp.cuda.Device().attributes["ClockRate"] / 1e3)  # ClockRate: kHz
    return lambda: spin((1,), (1,), (cycles,))


def main() -> None:
    ap = bench_offload.decode_bench_parser(__doc__.split("\n\n")[0], tokens=64)
    ap.add_argument("--runs", type=int, default=2, help="measured runs after one warm-up run")
    ap.add_argument("--queue-ahead-us", type=float, default=0.0,
                    help="CUDA: spin the GPU this long before each op, so its events time its kernels, not its "
                         "launching (not for ops that wait on the host inside: offloaded moe, nested uploads)")
    args = bench_offload.parse_decode_bench(ap)
    if args.queue_ahead_us and args.backend != "cuda":
        ap.error("--queue-ahead-us times kernels: it needs --backend cuda")
    offload = bench_offload.decode_offload(args.slots)
    engine, load_s = bench_offload.load(args, offload, args.context + args.tokens + 16, graphs=False)
    brackets = OuterBrackets()
    instrument(engine, brackets, OPS, prompt_parts=False)
    if args.queue_ahead_us:
        brackets.lead = queue_ahead(args.queue_ahead_us)
    rng = np.random.default_rng(0)
    runs = []
    for i in range(args.runs + 1):
        engine.reset()
        prompt = rng.integers(0, engine.model_config.n_vocab, size=args.context).tolist()
        token = int(np.argmax(engine.prefill(prompt)))  # the logits after the prompt's last token (host)
        brackets.clear()
        t0 = time.perf_counter()
        for _ in range(args.tokens):
            token = int(np.argmax(engine.decode(token)))
        wall = time.perf_counter() - t0
        ops = brackets.figures()
        if i == 0:
            continue  # the warm-up: kernels load, pools grow
        gpu = [v["gpu_s"] for k, v in ops.items() if not k.startswith("sync") and "(nested)" not in k and v["gpu_s"]]
        runs.append({"wall_ms_per_token": 1e3 * wall / args.tokens,
                     "ops_gpu_ms_per_token": 1e3 * sum(gpu) / args.tokens if gpu else None,
                     "ops": per_token(ops, args.tokens)})
        print(f"run {i}: {1e3 * wall / args.tokens:.3f} ms a token" +
              (f", ops on the GPU {1e3 * sum(gpu) / args.tokens:.3f} ms" if gpu else ""), file=sys.stderr)
    from runner.environment import environment

    out = {"benchmark": "decode_ops", "environment": environment(),
           "args": {k: v for k, v in vars(args).items() if k not in ("routing", "synthetic_routing")},
           "load_s": load_s, "model": args.model, "layers": engine.model_config.n_layer, "runs": runs,
           "note": ("queue-ahead: a spin ran before each op while the host launched it, so an op's GPU time is its "
                    "kernels' alone unless it waits inside for the host (the offloaded moe reads its ids back; a "
                    "small upload inside an op waits for the spin: see the nested cupy.asarray row); "
                    "wall_ms_per_token counts the spins. " if args.queue_ahead_us else "") +
                   "eager decode (no CUDA graphs), greedy; ops_gpu_ms_per_token sums the bracketed ops' GPU time "
                   "(under offload moe's includes its wait for the misses' uploads); wall minus it is launch and "
                   "host time a graph would partly remove. Random weights, random routing."}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
