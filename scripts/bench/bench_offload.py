"""Expert offload on the CUDA backend: pinned bandwidth, streamed prefill per order, decode per slot count; writes JSON.

One arm per process (shared/MEASURING.md: each configuration in a fresh process); a shell loop runs
the arms one after another. Prompts are random token ids, unique per run (no prefix reuse: the
engine is reset before each), and the first run of every length is a discarded warm-up. Prefill
arms run cold (no warm restore), so every prompt moves the whole expert set per crossing; the
physical limit quoted beside each is expert set bytes x crossings / the measured pinned rate.
Decode runs segmented CUDA graphs (runner/backends/cuda/decode_segments.py) unless --eager, or one graph a step
with --decode-graph directory (runner/backends/cuda/token_graph.py); its record says which,
and times the first two decode steps after each prompt apart (first_two_steps_ms: on CUDA they warm up
and capture the graphs when the prompt's transaction dropped them, which it does only when they would
not fit beside the prompt, stats()["graphs"]; steady_decode_tok_s is the rest),
with the segments per step, the host steps between them, and per token the time those steps waited
for the segment before (GPU work and the ids download) and spent on the host after it (fetch, tables).
Hit rate and miss bytes are decode's alone: a prompt the cost model ran through the cache (no
transaction) is counted apart, in prompts_through_cache and, when there was one, its bytes per run.

    python -m scripts.bench.bench_offload bandwidth --out bw.json
    python -m scripts.bench.bench_offload pinning --gib 16 --out pin.json
    python -m scripts.bench.bench_offload prefill MODEL --order layer_major --ubatch 2048 --lengths 2048,8192 --out p.json
    python -m scripts.bench.bench_offload decode MODEL --slots 150 --contexts 1024,8192 --out d.json
    python -m scripts.bench.bench_offload decode MODEL --slots 150 --contexts 1024,8192 --eager --out d_eager.json
    python -m scripts.bench.bench_offload decode MODEL --slots 150 --routing locality-qwen3-30b-a3b --out d_loc.json

--routing random (the default) keeps the file's router; locality-PRESET swaps its ids for a seeded
process with temporal locality calibrated to measured LRU hit rates (runner/offload/locality_routing.py),
uniform for k distinct experts drawn uniformly per position (no locality); the record says so: its
"benchmark" name, and a "routing" entry with the fitted parameters.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import numpy as np

from runner.backends.budget import GIB
from runner.backends.cuda.decode_segments import SegmentedDecodeGraph
from runner.cli.progress import arena_progress
from runner.engine.engine import Engine, EngineConfig
from runner.engine.sampling import SamplingParams
from runner.offload.locality_routing import PRESETS
from runner.offload.offload import OffloadConfig
from runner.offload.synthetic_routing import RANDOM, RoutingMode, attach, random_routing_record
from scripts.bench.common import bench_ops, environment, summary


def h2d_gb_s(host: np.ndarray, runs: int) -> dict[str, float]:
    import cupy as cp

    dev = cp.empty(host.nbytes, dtype=cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    rates = []
    for i in range(runs + 1):
        start, end = stream.record(), None
        cp.cuda.runtime.memcpyAsync(dev.data.ptr, host.ctypes.data, host.nbytes, 1, stream.ptr)
        end = stream.record()
        end.synchronize()
        if i:  # the first copy is a warm-up
            rates.append(host.nbytes / (cp.cuda.get_elapsed_time(start, end) / 1e3) / 1e9)
    return summary(rates)


def bandwidth(args: argparse.Namespace) -> dict:
    from runner.backends.cuda.expert_arena import pinned_host

    nbytes = int(args.gib * GIB)
    pinned = pinned_host(nbytes).array
    pinned[:] = 1
    pageable = np.ones(nbytes, dtype=np.uint8)
    return {"bytes": nbytes, "pinned_gb_s": h2d_gb_s(pinned, args.runs), "pageable_gb_s": h2d_gb_s(pageable, args.runs)}


def _write_on_threads(host: np.ndarray, threads: int = 8) -> None:
    """Fault every page in the way the store's fill does: pieces written on threads (numpy releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    step = -(-host.nbytes // threads)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: host[i * step : (i + 1) * step].fill(1), range(threads)))


def _register_in_pieces(host: np.ndarray, pieces: int) -> list:
    """cudaHostRegister on `pieces` page-aligned pieces at once, each on its own thread; their unlocks."""
    from concurrent.futures import ThreadPoolExecutor

    from runner.backends.cuda.expert_arena import pin_in_place

    step = -(-host.nbytes // pieces // 4096) * 4096
    with ThreadPoolExecutor(pieces) as pool:
        return list(pool.map(lambda i: pin_in_place(host[i * step : (i + 1) * step]), range(pieces)))


def pinning(args: argparse.Namespace) -> dict:
    """Ways to get `--gib` of filled, pinned host memory, timed step by step, each followed by its copy rate to the
    device and whether the device maps it at its host address: cudaHostAlloc then the fill (the store before
    2026-12-06c); anonymous pages faulted in by the fill then cudaHostRegister in one call (the store now), with
    transparent huge pages asked for, and in 4 pieces registered on 4 threads."""
    import cupy as cp

    from runner.backends.cuda.expert_arena import pin_in_place, pinned_host
    from runner.offload.host_store import host_pages

    nbytes = int(args.gib * GIB)
    arms: dict[str, dict] = {}
    for arm in ("host_alloc", "register", "register_hugepage", "register_4_pieces"):
        t0 = time.perf_counter()
        host = pinned_host(nbytes).array if arm == "host_alloc" else host_pages(nbytes, arm == "register_hugepage")
        t1 = time.perf_counter()
        _write_on_threads(host)
        t2 = time.perf_counter()
        unlocks = [] if arm == "host_alloc" else (
            _register_in_pieces(host, 4) if arm == "register_4_pieces" else [pin_in_place(host)])
        t3 = time.perf_counter()
        middle = host.ctypes.data + nbytes // 2
        mapped = cp.cuda.runtime.pointerGetAttributes(middle).devicePointer == middle
        arms[arm] = {"allocate_s": t1 - t0, "fill_s": t2 - t1, "pin_s": t3 - t2, "total_s": t3 - t0,
                     "total_gb_s": nbytes / (t3 - t0) / 1e9, "mapped_at_host_address": bool(mapped),
                     "h2d_gb_s": h2d_gb_s(host[: 2 * GIB], args.runs)}
        print(arm, json.dumps(arms[arm]), flush=True)
        for unlock in unlocks:
            unlock()
        del host
    return {"bytes": nbytes, "arms": arms}


def decode_offload(slots: str, decode_graph: str = "segments") -> OffloadConfig | None:
    """The op-by-op decode benches' offload: `slots` per MoE layer with layer-major staged prompts, or None for
    'resident' (every expert on the device)."""
    if slots == "resident":
        return None
    return OffloadConfig(cache_slots=int(slots), prefill_order="layer_major", prefill_ubatch=2048, transaction="auto",
                         warm_fill="staging", decode_graph=decode_graph)


def decode_bench_parser(description: str, tokens: int) -> argparse.ArgumentParser:
    """The op-by-op decode benches' arguments (decode_ops, graph_launches); each adds its own."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("model")
    ap.add_argument("--context", type=int, default=1024, help="prompt tokens before the measured decode")
    ap.add_argument("--tokens", type=int, default=tokens, help="decoded tokens measured (in each run)")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "numpy"))
    ap.add_argument("--vram-budget", type=float, default=24.0, help="GiB")
    ap.add_argument("--slots", default="150", help="cache slots per MoE layer, or 'resident' (no offload)")
    ap.add_argument("--out", required=True)
    return ap


def parse_decode_bench(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """decode_bench_parser's arguments, with what load() reads besides: the server's micro-batch, the file's router."""
    args = ap.parse_args()
    args.server_ubatch, args.routing = 512, RoutingMode.parse(RANDOM)
    return args


def load(args: argparse.Namespace, offload: OffloadConfig | None, n_ctx: int,
         graphs: bool = True) -> tuple[Engine, float]:
    """The engine on args.model, with `offload` (None: every expert resident), and its load seconds."""
    t0 = time.perf_counter()
    if offload is not None:  # the numpy dry run's budget too
        offload = dataclasses.replace(offload, vram_budget_bytes=int(args.vram_budget * GIB))
    with arena_progress() as progress:  # a bar on a terminal's stderr; the JSON out stays clean
        engine = Engine.load(args.model, EngineConfig(n_ctx=n_ctx, ubatch=args.server_ubatch, offload=offload),
                             ops=bench_ops(args.backend, args.vram_budget, graphs), arena_progress=progress)
    load_s = time.perf_counter() - t0
    args.synthetic_routing = attach(engine, args.routing)  # calibrates and draws its table: not load time
    args.routing_setup_s = time.perf_counter() - t0 - load_s
    return engine, load_s


class GraphCounters:
    """Replays, ids-wait and host-step seconds of the engine's segmented decode graph since the last look
    (a graph that a prompt's transaction dropped is replaced by a new one, counted from zero)."""

    def __init__(self, engine: Engine):
        self.engine, self.graph, self.seen = engine, None, (0, 0.0, 0.0)

    def current(self):
        look = getattr(self.engine.ops, "decode_graph", None)  # None on numpy
        graph = look(self.engine.kv) if look is not None else None
        return graph if isinstance(graph, SegmentedDecodeGraph) else None

    def since_last(self) -> tuple[int, float, float]:
        graph = self.current()
        if graph is None:
            return 0, 0.0, 0.0
        before = self.seen if graph is self.graph else (0, 0.0, 0.0)
        self.graph, self.seen = graph, (graph.replays, graph.ids_wait_s, graph.host_step_s)
        replays, wait_s, host_s = (now - then for now, then in zip(self.seen, before))
        return int(replays), wait_s, host_s


def prefill(args: argparse.Namespace) -> dict:
    lengths = [int(n) for n in args.lengths.split(",")]
    offload = OffloadConfig(cache_slots=args.slots, prefill_order=args.order, prefill_ubatch=args.ubatch,
                            warm_restore=False, transaction="always")
    engine, load_s = load(args, offload, max(lengths) + 16)
    rng = np.random.default_rng(args.seed)
    vocab = engine.model_config.n_vocab
    set_bytes = engine.stats()["prefill"]["expert_set_bytes"]
    out = {"load_s": load_s, "n_layer": engine.model_config.n_layer, "expert_set_bytes": set_bytes,
           "pinned": engine.offload.store.pinned,
           "slots_per_layer": engine.offload.cache.slots_per_layer, "lengths": {}}
    for n in lengths:
        ttft, sets, release, restore = [], [], [], []
        for run in range(args.runs + 1):
            engine.reset()
            tokens = rng.integers(0, vocab, size=n).tolist()
            t0 = time.perf_counter()
            engine.prefill(tokens)  # logits of the last row on the host: the first token can be sampled
            elapsed = time.perf_counter() - t0
            if run == 0:
                continue
            s = engine.stats()
            ttft.append(elapsed)
            sets.append(s["prefill"]["last_prompt"]["expert_sets"])
            release.append(s["phase"]["last"]["release_s"])
            restore.append(s["phase"]["last"]["restore_s"])
        crossings = statistics.median(sets)
        limit_s = crossings * set_bytes / (args.pinned_gb_s * 1e9) if args.pinned_gb_s else None
        med = statistics.median(ttft)
        out["lengths"][str(n)] = {
            "ttft_s": summary(ttft), "prefill_tok_s": summary([n / t for t in ttft]), "expert_sets": summary(sets),
            "bytes": crossings * set_bytes, "pcie_limit_s": limit_s,
            "fraction_of_pcie_limit": limit_s / med if limit_s else None,
            "release_s": summary(release), "restore_s": summary(restore)}
    s = engine.stats()
    out["budget"] = s["budget"]
    return out


def decode(args: argparse.Namespace) -> dict:
    contexts = [int(c) for c in args.contexts.split(",")]
    offload = OffloadConfig(cache_slots=args.slots, prefill_order="layer_major", prefill_ubatch=args.ubatch,
                            warm_restore=True, transaction="auto", decode_graph=args.decode_graph)
    engine, load_s = load(args, offload, max(contexts) + args.tokens + 16, graphs=not args.eager)
    rng = np.random.default_rng(args.seed)
    vocab = engine.model_config.n_vocab
    greedy = SamplingParams(temperature=0.0)
    graphs = GraphCounters(engine)
    mode = "off" if args.eager else engine.offload.decode_graph if args.backend == "cuda" else "none (numpy backend)"
    out = {"load_s": load_s, "n_layer": engine.model_config.n_layer, "pinned": engine.offload.store.pinned,
           "decode_graphs": mode,
           "slots_per_layer": engine.offload.cache.slots_per_layer, "contexts": {}}
    for c in contexts:
        rates, steady, first_ms, hit_rates, miss_bytes, wait_ms, host_ms = [], [], [], [], [], [], []
        through_cache, through_cache_bytes = 0, []
        for run in range(args.runs + 1):
            engine.reset()
            prompt = rng.integers(0, vocab, size=c).tolist()
            s = engine.stats()
            before, prompt_before = s["cache"]["total"], s["through_cache"]
            stamps: list[float] = []
            gen = engine.generate(prompt, args.tokens, greedy, ignore_eos=True)
            for step in gen.steps():
                if step.token is not None:  # the last step may flush held-back text only
                    stamps.append(time.perf_counter())
            s = engine.stats()
            after, prompt_after = s["cache"]["total"], s["through_cache"]
            replays, wait_s, host_s = graphs.since_last()
            if run == 0:
                continue
            # a prompt the cost model sent through the cache: its lookups and uploads are not decode's
            skipped = {key: prompt_after[key] - prompt_before[key]
                       for key in ("prompts", "hits", "misses", "bytes_uploaded")}
            if skipped["prompts"]:
                through_cache += skipped["prompts"]
                through_cache_bytes.append(skipped["bytes_uploaded"])
            n = len(gen.tokens)
            rates.append((n - 1) / (stamps[-1] - stamps[0]))
            if n > 3:  # past the first two decode steps (warm-up and capture if the prompt dropped the graphs)
                steady.append((n - 3) / (stamps[-1] - stamps[2]))
                first_ms.append((stamps[2] - stamps[0]) * 1e3)
            if replays:
                wait_ms.append(wait_s / replays * 1e3)
                host_ms.append(host_s / replays * 1e3)
            hits = after["hits"] - before["hits"] - skipped["hits"]
            misses = after["misses"] - before["misses"] - skipped["misses"]
            hit_rates.append(hits / max(1, hits + misses))
            miss_bytes.append((after["bytes_uploaded"] - before["bytes_uploaded"] - skipped["bytes_uploaded"]) / n)
        figures = {"decode_tok_s": summary(rates), "hit_rate": summary(hit_rates),
                   "miss_bytes_per_token": summary(miss_bytes), "tokens": args.tokens,
                   "prompts_through_cache": through_cache}
        if through_cache_bytes:
            figures["prompt_through_cache_bytes"] = summary(through_cache_bytes)
        if steady:
            figures["steady_decode_tok_s"] = summary(steady)
            figures["first_two_steps_ms"] = summary(first_ms)  # what steady leaves out: the graphs' rebuild
        graph = graphs.current()
        if graph is not None and host_ms:
            figures.update(segments=len(graph.segments), host_steps_per_token=len(graph.host_steps),
                           ids_wait_ms_per_token=summary(wait_ms), host_step_ms_per_token=summary(host_ms))
        out["contexts"][str(c)] = figures
    out["budget"] = engine.stats()["budget"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("arm", choices=["bandwidth", "pinning", "prefill", "decode"])
    ap.add_argument("model", type=Path, nargs="?")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit", default=None, help="default: the checkout's (git rev-parse HEAD)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vram-budget", type=float, default=24.0, help="GiB")
    ap.add_argument("--slots", default="auto", help="cache slots per layer, or auto")
    ap.add_argument("--order", default="layer_major", choices=["layer_major", "per_microbatch"])
    ap.add_argument("--ubatch", type=int, default=2048, help="prefill micro-batch inside the transaction")
    ap.add_argument("--server-ubatch", type=int, default=512)
    ap.add_argument("--lengths", default="2048,8192")
    ap.add_argument("--contexts", default="1024,8192")
    ap.add_argument("--tokens", type=int, default=32, help="decoded tokens per run")
    ap.add_argument("--pinned-gb-s", type=float, default=None, help="measured pinned rate, for the limit")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "numpy"], help="numpy: a dry run on the CPU")
    ap.add_argument("--gib", type=float, default=2.0, help="bandwidth: bytes per copy; pinning: bytes per arm")
    ap.add_argument("--eager", action="store_true", help="decode: no CUDA graphs (the A/B arm of segmented graphs)")
    ap.add_argument("--decode-graph", default="segments", choices=["segments", "directory"],
                    help="decode: graphs cut at each router (segments) or one a step with device directories")
    ap.add_argument("--routing", default=RANDOM, help="random (the file's router), uniform, or locality-PRESET: "
                    f"synthetic ids with locality, presets {', '.join(PRESETS)}")
    ap.add_argument("--routing-seed", type=int, default=0, help="the synthetic routing's seed")
    args = ap.parse_args()
    if args.slots != "auto":
        args.slots = int(args.slots)
    args.routing = RoutingMode.parse(args.routing, args.routing_seed)
    if args.routing.synthetic and args.arm in ("bandwidth", "pinning"):
        ap.error("--routing: the bandwidth arm runs no model")
    args.synthetic_routing, args.routing_setup_s = None, 0.0
    result = {"bandwidth": bandwidth, "pinning": pinning, "prefill": prefill, "decode": decode}[args.arm](args)
    routing = args.synthetic_routing
    benchmark = f"offload_{args.arm}"
    if routing is not None:
        routing.require_used()  # a model whose MoE block never asked ran the router's ids: refuse the label
        benchmark += f" (synthetic routing: {args.routing.label})"
    argv = {k: v for k, v in vars(args).items() if k not in ("synthetic_routing", "routing_setup_s")}
    argv["routing"] = args.routing.label
    record = {"benchmark": benchmark, "model": args.model.name if args.model else None,
              "routing": (routing.record() | {"setup_s": args.routing_setup_s}) if routing else random_routing_record(),
              "environment": environment(args.commit, argv), **result}
    args.out.write_text(json.dumps(record, indent=2, default=str))
    print(json.dumps(record, default=str)[:2000])


if __name__ == "__main__":
    main()
