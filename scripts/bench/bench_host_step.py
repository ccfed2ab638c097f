"""The host step of segmented offloaded decode, timed on the CPU per MoE layer; writes JSON.

Between two decode segments the host takes one MoE layer's routed ids, fetches those experts through
the slot cache (hits touch the eviction policy, misses evict and upload) and writes the gate, up and
down address of each (token, expert) pair into the layer's table (runner/backends/cuda/decode_segments.py HostStep).
This replays that host step over a Zipf-routed id stream on a seed-shaped cache (512 experts per
layer, top-10, 150 slots, 15 MoE layers; Zipf 1.35 gives about 86% hits under LRU) whose experts are tiny, with the numpy arena
and stand-ins for CuPy's arrays (`.data.ptr` at CuPy's cost, `.set`/`.get` as copies). Uploads are memcpys
here and are timed apart. CuPy's own per-call costs (slicing views, `.set`, memcpyAsync, events) are
not in these figures: they show the Python work, which on the H200 was ~260 us of a layer's host step.

    python -m scripts.bench.bench_host_step --out host_step.json [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import json
import pstats
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.budget import GIB, DeviceBudget
from runner.backends.cuda.decode_segments import HostStep, LayerTables
from runner.gguf_file import TensorInfo
from runner.models.weights import MoEWeights
from runner.offload.device_arena import EmulatedDeviceArena
from runner.offload.host_store import HostExpertStore
from runner.offload.provider import MATRICES, ExpertMatrices, experts_by_recency
from runner.offload.slot_cache import ExpertSlotCache
from scripts.bench.common import environment, summary

Q8_0_BLOCK, Q8_0_BYTES = 32, 34


class _Pointer:
    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


_NO_ADDRESS = _Pointer(0)


class DeviceBytes(np.ndarray):
    """numpy bytes that answer `.data.ptr` at about CuPy's cost (two attribute reads) but not with their
    address: numpy's own (`.ctypes.data`) costs ~3 us, which would swamp the table. No value is checked here."""

    @property
    def data(self) -> _Pointer:  # type: ignore[override]
        return _NO_ADDRESS


class DeviceTable(np.ndarray):
    """A "device" array of the layer tables (and of the ids): `.data.ptr` is its numpy address, so the
    host step's raw copies (FAKE_CUPY's memcpyAsync, a memmove) land in it as on a drained stream."""

    @property
    def data(self) -> _Pointer:  # type: ignore[override]
        return _Pointer(self.ctypes.data)


def _memmove(dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
    ctypes.memmove(dst, src, nbytes)


class BenchArena(EmulatedDeviceArena):
    """The numpy arena with CuPy-like views; its uploads are timed apart (`upload_s`)."""

    def __init__(self, budget: DeviceBudget):
        super().__init__(budget)
        self.upload_s = 0.0

    def reserve(self, what: str, nbytes: int):
        region = super().reserve(what, nbytes)
        region.memory = region.memory.view(DeviceBytes)
        return region

    def upload(self, region, offset: int, host_bytes: np.ndarray, host_address: int | None = None) -> None:
        t0 = time.perf_counter()
        super().upload(region, offset, host_bytes, host_address)
        self.upload_s += time.perf_counter() - t0


FAKE_CUPY = SimpleNamespace(cuda=SimpleNamespace(alloc_pinned_memory=bytearray, runtime=SimpleNamespace(memcpyAsync=_memmove)),
                            uint64=np.uint64, zeros=lambda shape, dtype: np.zeros(shape, dtype=dtype).view(DeviceTable))
FAKE_STREAM = SimpleNamespace(ptr=0, synchronize=lambda: None)


def moe_weights(layer: int, n_expert: int, n_embd: int, n_ff: int) -> MoEWeights:
    """An MoE layer's expert tensors as Q8_0 blocks of zeros (their values never matter here)."""

    def tensor(name: str, rows: int, cols: int) -> TensorInfo:
        data = np.zeros((n_expert, rows, cols // Q8_0_BLOCK * Q8_0_BYTES), dtype=np.uint8)
        return TensorInfo(f"blk.{layer}.{name}.weight", QT.Q8_0, (n_expert, rows, cols), data, 0)

    return MoEWeights(None, None, tensor("ffn_gate_exps", n_ff, n_embd), tensor("ffn_up_exps", n_ff, n_embd),
                      tensor("ffn_down_exps", n_embd, n_ff), None)


def routed_ids(rng: np.random.Generator, tokens: int, layers: int, n_expert: int, k: int, zipf: float) -> np.ndarray:
    """int32 [tokens, layers, k]: k distinct experts per token and layer, each layer with its own popular ones."""
    p = 1.0 / np.arange(1, n_expert + 1) ** zipf
    p /= p.sum()
    ids = np.empty((tokens, layers, k), dtype=np.int32)
    for layer in range(layers):
        order = rng.permutation(n_expert)
        for t in range(tokens):
            ids[t, layer] = order[rng.choice(n_expert, k, replace=False, p=p)]
    return ids


class Bench:
    """One fresh cache over the store, and the host steps of its layers (ids written as a segment would)."""

    def __init__(self, store: HostExpertStore, weights: list[MoEWeights], slots: int, policy: str, k: int):
        self.arena = BenchArena(DeviceBudget(64 * GIB))
        self.cache = ExpertSlotCache(store, self.arena, slots, policy)
        self.steps = [HostStep(w, np.zeros((1, k), dtype=np.int32).view(DeviceTable), LayerTables(FAKE_CUPY, k))
                      for w in weights]

    def host_steps(self, ids: np.ndarray, timed: bool) -> float:
        """Every token's host steps (the ids download first, untimed); seconds inside HostStep.fetch."""
        spent = 0.0
        for token in ids:
            for step, layer_ids in zip(self.steps, token):
                step.ids[0] = layer_ids
                step.read_ids(FAKE_STREAM)
                t0 = time.perf_counter()
                step.fetch(self.cache, FAKE_STREAM)
                spent += time.perf_counter() - t0
        return spent if timed else 0.0

    def fetches(self, ids: np.ndarray) -> tuple[float, float]:
        """The provider API alone (fetch of the distinct experts, as eager decode calls it), then the pair
        table from the views it returned; seconds each."""
        fetch_s = table_s = 0.0
        for token in ids:
            for step, layer_ids in zip(self.steps, token):
                t = step.tables
                t.ids_host[0] = layer_ids
                t0 = time.perf_counter()
                got = self.cache.fetch(step.w, experts_by_recency(t.ids_host))
                t1 = time.perf_counter()
                pair_addresses(t.ids_host, got, t.table_host)
                table_s += time.perf_counter() - t1
                fetch_s += t1 - t0
        return fetch_s, table_s


def pair_addresses(ids: np.ndarray, got: dict[int, ExpertMatrices], out: np.ndarray) -> np.ndarray:
    """out uint64 [3, T * k]: row r holds matrix MATRICES[r]'s device address for each pair of ids [T, k], from
    the experts a provider returned (the eager path's table fill, which the slot cache now does itself)."""
    for p, e in enumerate(np.asarray(ids).reshape(-1).tolist()):
        m = got[e]
        for r, which in enumerate(MATRICES):
            out[r, p] = getattr(m, which).data.ptr
    return out


def timed_counters(before: dict, after: dict) -> dict:
    """The cache counters of the timed steps alone."""
    out = {k: after[k] - before[k] for k in ("hits", "misses", "evictions", "bytes_uploaded")}
    return {**out, "hit_rate": out["hits"] / max(1, out["hits"] + out["misses"])}


def run_policy(store, weights, ids, args, policy: str) -> dict:
    warm, timed = ids[: args.warmup], ids[args.warmup :]
    steps = timed.shape[0] * timed.shape[1]
    us = lambda s: s / steps * 1e6  # noqa: E731
    host, uploads, fetch, table, counters = [], [], [], [], None
    for _ in range(args.runs):
        b = Bench(store, weights, args.slots, policy, args.k)
        b.host_steps(warm, timed=False)
        before, counted = b.arena.upload_s, b.cache.total().to_dict()
        host.append(us(b.host_steps(timed, timed=True)))
        uploads.append(us(b.arena.upload_s - before))
        counters = timed_counters(counted, b.cache.total().to_dict())
        b = Bench(store, weights, args.slots, policy, args.k)
        b.fetches(warm)
        before = b.arena.upload_s
        fetch_s, table_s = b.fetches(timed)
        fetch.append(us(fetch_s - (b.arena.upload_s - before)))
        table.append(us(table_s))
    return {"host_step_us": summary(host), "uploads_us": summary(uploads),
            "host_step_excl_uploads_us": summary([h - u for h, u in zip(host, uploads)]),
            "fetch_excl_uploads_us": summary(fetch), "pair_table_from_views_us": summary(table),
            "timed_counters": counters}


def profile(store, weights, ids, args, policy: str, top: int = 25) -> None:
    """cProfile of the timed host steps (one run), the top functions by own time to stderr."""
    b = Bench(store, weights, args.slots, policy, args.k)
    b.host_steps(ids[: args.warmup], timed=False)
    prof = cProfile.Profile()
    prof.runcall(b.host_steps, ids[args.warmup :], True)
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit", default=None, help="default: the checkout's (git rev-parse HEAD)")
    ap.add_argument("--experts", type=int, default=512, help="per MoE layer")
    ap.add_argument("--k", type=int, default=10, help="experts per token")
    ap.add_argument("--layers", type=int, default=15, help="MoE layers")
    ap.add_argument("--slots", type=int, default=150, help="cache slots per layer")
    ap.add_argument("--policies", default="lru,lfu")
    ap.add_argument("--zipf", type=float, default=1.35, help="routing skew: expert of popularity rank r has weight r^-zipf")
    ap.add_argument("--tokens", type=int, default=400, help="timed tokens per run")
    ap.add_argument("--warmup", type=int, default=200, help="tokens that fill the cache first, untimed")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="cProfile one run's host steps per policy (stderr)")
    args = ap.parse_args()
    weights = [moe_weights(i + 1, args.experts, Q8_0_BLOCK, Q8_0_BLOCK) for i in range(args.layers)]
    store = HostExpertStore(SimpleNamespace(layers=[SimpleNamespace(ffn=w) for w in weights], nextn=()))
    ids = routed_ids(np.random.default_rng(args.seed), args.warmup + args.tokens, args.layers, args.experts, args.k,
                     args.zipf)
    result = {}
    for policy in args.policies.split(","):
        result[policy] = run_policy(store, weights, ids, args, policy)
        if args.profile:
            profile(store, weights, ids, args, policy)
    record = {"benchmark": "host_step", "environment": environment(args.commit, vars(args)),
              "expert_bytes": store.expert_bytes(1), "policies": result}
    args.out.write_text(json.dumps(record, indent=2))
    print(json.dumps({p: {k: v["median"] if isinstance(v, dict) and "median" in v else v.get("hit_rate")
                          for k, v in r.items()} for p, r in result.items()}))


if __name__ == "__main__":
    main()
