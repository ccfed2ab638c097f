"""Where a prompt's time goes, op by op: every Ops method the model calls during a streamed prefill,
bracketed by host clocks and (on CUDA) by events on the compute stream, and every device-to-host copy the
host waits on (`cp.asnumpy`), counted. Writes JSON (shared/MEASURING.md: a benchmark, not a test).

The compute stream's span of a prompt minus its ops' GPU time is the time the GPU sat idle waiting for the
host (syncs, Python between launches) or for uploads; the sync count says how often the host drained it.
Nested brackets (moe and its parts inside it, or an op another op calls through the instance, as numpy's
moe calls swiglu) are reported under their own names: the parts are inside their parent, not beside it.

    python -m scripts.bench.prefill_ops MODEL.gguf --tokens 8192 --out ops.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from runner.offload.offload import OffloadConfig
from runner.offload.synthetic_routing import RANDOM, RoutingMode
from scripts.bench import bench_offload

OPS = ("embed", "rms_norm", "linear", "rope_neox", "rope_kv_store", "attention", "swiglu", "concat_rows", "route", "moe")
MOE_PARTS = ("dense", "group_by_expert", "gate_up_kernel", "down_kernel")  # runner/backends/cuda/moe_prefill.py


class PoolWatch:
    """CuPy's default pool behind an allocator that counts the allocations after which the pool's size differs:
    each a cudaMalloc (after cudaFrees of its cached blocks when the pool met its limit). A pool that keeps
    meeting its limit shows many changes and little net growth."""

    def __init__(self, cp: Any):
        self.pool, self.changes = cp.get_default_memory_pool(), 0

    def malloc(self, size: int) -> Any:
        before = self.pool.total_bytes()
        memory = self.pool.malloc(size)
        self.changes += self.pool.total_bytes() != before
        return memory


@dataclasses.dataclass
class Call:
    """One top-level bracketed call, as its group keeps it."""

    name: str
    host_s: float
    events: Any  # its (start, end) pair on the compute stream, or None
    grew: int  # bytes the pool grew by
    changes: int  # allocations that changed the pool's size


@dataclasses.dataclass
class Brackets:
    """Per name: calls, host seconds inside the call, (CUDA) event pairs on the compute stream and the bytes
    CuPy's pool grew by inside the call (cudaMalloc'd there; nested calls count in their parent too).

    Top-level calls are also summed in groups, each closed by a call of `group_end` (a layer's MoE, in a
    layer-major prompt: group 0 is the dense layer and the first MoE layer's attention): where in the prompt
    the time and the pool's growth are, e.g. whether the first MoE layer pays for allocations the others reuse."""

    cuda: Any = None  # the cupy module on the CUDA backend
    watch: PoolWatch | None = None  # when set (CUDA), each op's pool changes are counted too
    group_end: str = "moe"
    host_s: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    events: dict[str, list[tuple[Any, Any]]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    grown: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    changes: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    groups: list[list[Call]] = dataclasses.field(default_factory=lambda: [[]])
    # When set (CUDA), enqueued before each top-level call's start event: a spin kernel that keeps the GPU busy
    # while the host launches the call, so the events time its kernels, not the host's launching them.
    lead: Callable[[], None] | None = None
    _open: int = 0  # bracketed calls under way: 0 at a top-level call's start

    def pool_bytes(self) -> int | None:
        return int(self.cuda.get_default_memory_pool().total_bytes()) if self.cuda is not None else None

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def bracketed(*args: Any, **kwargs: Any) -> Any:
            pair, before = None, self.pool_bytes()
            changes_before = self.watch.changes if self.watch is not None else 0
            if self.cuda is not None:
                if self.lead is not None and self._open == 0:
                    self.lead()
                stream = self.cuda.cuda.get_current_stream()
                pair = (self.cuda.cuda.Event(), self.cuda.cuda.Event())
                pair[0].record(stream)
            t0 = time.perf_counter()
            self._open += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                self._open -= 1
            host = time.perf_counter() - t0
            self.host_s[name] += host
            self.calls[name] += 1
            grew = 0 if before is None else self.pool_bytes() - before  # type: ignore[operator]
            self.grown[name] += grew
            changed = self.watch.changes - changes_before if self.watch is not None else 0
            self.changes[name] += changed
            if pair is not None:
                pair[1].record(self.cuda.cuda.get_current_stream())
                self.events[name].append(pair)
            if self._open == 0:
                self.groups[-1].append(Call(name, host, pair, grew, changed))
                if name == self.group_end:
                    self.groups.append([])
            return out
        return bracketed

    def clear(self) -> None:
        self.host_s.clear()
        self.calls.clear()
        self.events.clear()
        self.grown.clear()
        self.changes.clear()
        self.groups = [[]]

    def _gpu_s(self, pairs: list[Any]) -> float | None:
        if self.cuda is None:
            return None
        return sum(self.cuda.cuda.get_elapsed_time(a, b) for a, b in pairs) / 1e3

    def figures(self) -> dict[str, dict[str, Any]]:
        if self.cuda is not None:
            self.cuda.cuda.Device().synchronize()
        out = {}
        for name in sorted(self.calls, key=lambda n: -self.host_s[n]):
            gpu = self._gpu_s(self.events[name])
            out[name] = {"calls": self.calls[name], "host_s": self.host_s[name], "gpu_s": gpu}
            if self.cuda is not None:
                out[name]["pool_grow_bytes"] = self.grown[name]
            if self.watch is not None:
                out[name]["pool_changes"] = self.changes[name]
        return out

    def group_figures(self) -> list[dict[str, Any]]:
        """Per group (in call order; the last may be the trailing ops after the last `group_end`): its top-level
        calls, their host and GPU seconds and pool figures, and the closing call's own."""
        return [{**self._summed(group), "calls": len(group),
                 self.group_end: self._summed(group[-1:]) if group[-1].name == self.group_end else None}
                for group in self.groups if group]

    def _summed(self, calls: list[Call]) -> dict[str, Any]:
        out = {"host_s": sum(c.host_s for c in calls), "gpu_s": self._gpu_s([c.events for c in calls])}
        if self.cuda is not None:
            out["pool_grow_bytes"] = sum(c.grew for c in calls)
        if self.watch is not None:
            out["pool_changes"] = sum(c.changes for c in calls)
        return out


def instrument(engine: Any, brackets: Brackets, names: tuple[str, ...] = OPS, prompt_parts: bool = True) -> None:
    """Bracket the engine's ops `names` (on the instance) and, on CUDA, the host's waits and (`prompt_parts`)
    moe_prefill's parts."""
    for name in names:
        if hasattr(engine.ops, name):
            setattr(engine.ops, name, brackets.wrap(name, getattr(engine.ops, name)))
    if engine.ops.name != "cuda":
        return
    import cupy as cp

    from runner.backends.cuda import moe_prefill, ops as cuda_ops

    brackets.cuda = cp
    if prompt_parts:
        brackets.watch = PoolWatch(cp)
        cp.cuda.set_allocator(brackets.watch.malloc)
    for name in MOE_PARTS if prompt_parts else ():
        part = "moe." + name
        if name == "dense":
            moe_prefill.ExpertMatrixSet.dense_at = brackets.wrap(part, moe_prefill.ExpertMatrixSet.dense_at)
        else:
            setattr(moe_prefill, name, brackets.wrap(part, getattr(moe_prefill, name)))
    if prompt_parts:  # the streamed moe's host work before the kernels: recency, addresses, then moe_prefill
        cuda_ops.experts_by_recency = brackets.wrap("moe.recency", cuda_ops.experts_by_recency)
        cuda_ops.moe_prefill = brackets.wrap("moe.prefill", cuda_ops.moe_prefill)
        if getattr(engine, "offload", None) is not None:
            engine.offload.prompt_addresses = brackets.wrap("moe.addresses", engine.offload.prompt_addresses)
    # every device-to-host copy in these modules is a wait for the stream to drain: count them
    for module in (cuda_ops, moe_prefill) if prompt_parts else (cuda_ops,):
        module.cp = _CountingCupy(cp, brackets)


class _CountingCupy:
    """The cupy module with asnumpy bracketed as "sync (asnumpy)", and argsort (thrust: the host waits for it) and
    asarray (host to device copies) as "cupy.NAME": a module's `cp.` calls go through it."""

    def __init__(self, cp: Any, brackets: Brackets):
        self._cp, self.asnumpy = cp, brackets.wrap("sync (asnumpy)", cp.asnumpy)
        self.argsort, self.asarray = (brackets.wrap(f"cupy.{n}", getattr(cp, n)) for n in ("argsort", "asarray"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cp, name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--runs", type=int, default=2, help="measured prompts after one warm-up prompt")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "numpy"))
    ap.add_argument("--vram-budget", type=float, default=24.0, help="GiB")
    ap.add_argument("--slots", type=int, default=150)
    ap.add_argument("--ubatch", type=int, default=2048, help="the prompt's micro-batch")
    ap.add_argument("--warm-fill", default="host", choices=("host", "staging"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    args.server_ubatch, args.routing = 512, RoutingMode.parse(RANDOM)
    offload = OffloadConfig(cache_slots=args.slots, prefill_order="layer_major", prefill_ubatch=args.ubatch,
                            transaction="always", warm_fill=args.warm_fill)
    engine, load_s = bench_offload.load(args, offload, args.tokens + 16)
    brackets = Brackets()
    instrument(engine, brackets)
    rng = np.random.default_rng(0)
    runs = []
    for i in range(args.runs + 1):
        engine.reset()
        brackets.clear()
        tokens = rng.integers(0, engine.model_config.n_vocab, size=args.tokens).tolist()
        pool_before = brackets.pool_bytes()
        t0 = time.perf_counter()
        engine.prefill(tokens)
        wall = time.perf_counter() - t0
        ops = brackets.figures()
        if i == 0:
            continue  # the warm-up: kernels load, pools grow
        top = [v["gpu_s"] for k, v in ops.items() if "." not in k and not k.startswith("sync") and v["gpu_s"]]
        runs.append({"wall_s": wall, "ops_gpu_s": sum(top) if top else None, "ops": ops,
                     "pool_bytes": {"before": pool_before, "after": brackets.pool_bytes()},
                     "groups": brackets.group_figures()})
        print(f"run {i}: {wall:.3f} s wall, ops on the GPU {sum(top):.3f} s" if top else f"run {i}: {wall:.3f} s",
              file=sys.stderr)
    from runner.environment import environment

    out = {"benchmark": "prefill_ops", "environment": environment(),
           "args": {k: v for k, v in vars(args).items() if k not in ("routing", "synthetic_routing")}, "load_s": load_s,
           "model": args.model, "layers": engine.model_config.n_layer, "runs": runs,
           "note": "ops_gpu_s sums the top-level ops' GPU time; wall_s minus it is time the GPU waited on the host "
                   "or on uploads (with the release and restore of the phase). pool_bytes: CuPy's pool before and "
                   "after the prompt; pool_grow_bytes: what it grew by inside a call (cudaMalloc); pool_changes: "
                   "the allocations inside a call that changed its size (cudaMalloc, with cudaFree at its limit); "
                   "groups: the top-level calls up to and including each moe call, in order. Random weights, "
                   "random routing."}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
