"""What a decode token launches under CUDA graphs, counted from the captured graphs themselves (nsys is not on
the GPU box, and issue 20 item 3 asks for launches per token before and after): each graph's nodes by type
(the driver's cuGraphGetNodes / cuGraphNodeGetType), the graphs launched per token (one, or one segment per
MoE layer), and the copy-engine uploads the segments' host steps enqueue per token (the expert arena's
counter). The step's own token and position copies (GraphBatch.load) are outside the graphs and not counted.
Writes JSON (shared/MEASURING.md: a benchmark, not a test).

    python -m scripts.bench.graph_launches MODEL.gguf [--slots 150|resident] [--decode-graph segments|directory] \\
        --out launches.json
"""

from __future__ import annotations

import ctypes
import json
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from scripts.bench import bench_offload

# CUgraphNodeType (cuda.h)
NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "child graph", 5: "empty", 6: "wait event",
              7: "event record", 8: "semaphore signal", 9: "semaphore wait", 10: "mem alloc", 11: "mem free",
              12: "batch mem op", 13: "conditional"}
LAUNCHES = ("kernel", "memcpy", "memset")  # the nodes that are work on the device, as a launch is


class GraphDriver(Protocol):
    def nodes(self, graph: int) -> list[int]: ...
    def node_type(self, node: int) -> int: ...


class CudaDriver:
    """GraphDriver through libcuda: a CuPy Graph's `.graph` is the CUgraph these take."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuGraphGetNodes.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        self.lib.cuGraphNodeGetType.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            raise RuntimeError(f"{what} failed with CUresult {result}")

    def nodes(self, graph: int) -> list[int]:
        n = ctypes.c_size_t(0)
        self._check(self.lib.cuGraphGetNodes(graph, None, ctypes.byref(n)), "cuGraphGetNodes")
        found = (ctypes.c_void_p * n.value)()
        self._check(self.lib.cuGraphGetNodes(graph, found, ctypes.byref(n)), "cuGraphGetNodes")
        return [int(p or 0) for p in found[: n.value]]

    def node_type(self, node: int) -> int:
        t = ctypes.c_int(-1)
        self._check(self.lib.cuGraphNodeGetType(node, ctypes.byref(t)), "cuGraphNodeGetType")
        return t.value


def captured_graphs(step_graph: Any) -> list[Any]:
    """The CuPy graphs one step launches, in order: a SegmentedDecodeGraph's segments, else its one graph."""
    segments = getattr(step_graph, "segments", None)
    if segments is not None:
        return list(segments)
    return [step_graph.graph] if getattr(step_graph, "graph", None) is not None else []


def node_counts(graphs: Iterable[Any], driver: GraphDriver) -> dict[str, int]:
    """Nodes by type over `graphs` (CuPy Graphs), and "launches": the kernel, copy and set nodes."""
    counts: Counter[str] = Counter()
    for graph in graphs:
        for node in driver.nodes(graph.graph):
            counts[NODE_TYPES.get(driver.node_type(node), "other")] += 1
    out = dict(sorted(counts.items()))
    out["launches"] = sum(counts[t] for t in LAUNCHES)
    return out


def describe(role: str, step_graph: Any, driver: GraphDriver) -> dict[str, Any]:
    """One step graph's figures: its role (decode, draft), rows, kind, graphs launched a step and their nodes."""
    graphs = captured_graphs(step_graph)
    return {"role": role, "rows": step_graph.rows,
            "kind": type(step_graph).__name__, "graphs_per_step": len(graphs), "nodes": node_counts(graphs, driver)}


def main() -> None:
    ap = bench_offload.decode_bench_parser(__doc__.split("\n\n")[0], tokens=32)
    ap.add_argument("--decode-graph", default="segments", choices=("segments", "directory"))
    args = bench_offload.parse_decode_bench(ap)
    if args.backend != "cuda":
        sys.exit("error: graph launches are counted on the CUDA backend only (numpy captures no graphs)")
    offload = bench_offload.decode_offload(args.slots, args.decode_graph)
    engine, load_s = bench_offload.load(args, offload, args.context + args.tokens + 16)
    rng = np.random.default_rng(0)
    token = int(np.argmax(engine.prefill(rng.integers(0, engine.model_config.n_vocab, size=args.context).tolist())))
    for _ in range(3):  # past the steps that warm up and capture after a prompt
        token = int(np.argmax(engine.decode(token)))
    arena = engine.offload.arena if engine.offload is not None else None
    uploads = arena.uploads if arena is not None else 0
    for _ in range(args.tokens):
        token = int(np.argmax(engine.decode(token)))
    uploads_per_token = ((arena.uploads - uploads) / args.tokens) if arena is not None else 0.0
    driver = CudaDriver()
    # CudaOps keys its graphs (id(kv), rows) for decode and verify, ("draft", id(kv), rows) for the NextN block
    graphs = [describe("draft" if key[0] == "draft" else "decode", g, driver)
              for key, g in engine.ops._decode_graphs.items()]
    step = engine.ops.decode_graph(engine.kv)
    if step is None:
        sys.exit("error: the decode ran without a captured graph (eager): nothing to count")
    decode = describe("decode", step, driver)
    from runner.environment import environment

    out = {"benchmark": "graph_launches", "environment": environment(),
           "args": {k: v for k, v in vars(args).items() if k not in ("routing", "synthetic_routing")},
           "load_s": load_s, "model": args.model, "layers": engine.model_config.n_layer,
           "decode_token": {**decode, "host_uploads_per_token": uploads_per_token,
                            "launches_per_token": decode["nodes"]["launches"] + uploads_per_token,
                            "graph_launches_per_token": decode["graphs_per_step"]},
           "graphs": graphs,
           "note": "launches: kernel, memcpy and memset nodes of the graphs one decode step launches, plus the "
                   "segments' host-step uploads per token (misses; the directory graph serves them inside). "
                   "Random weights, random routing."}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out["decode_token"]), file=sys.stderr)


if __name__ == "__main__":
    main()
