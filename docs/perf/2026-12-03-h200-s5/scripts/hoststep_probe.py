"""Where segmented decode's host step goes on the box: per-part timers around one decode run, plus
CuPy/CUDA API call costs alone. Ad hoc device probe (not a project benchmark); prints JSON."""
import json, sys, time, argparse
from pathlib import Path
from collections import defaultdict
import numpy as np
sys.path.insert(0, "scripts")
import cupy as cp
import bench_offload as bo
from runner.decode_segments import SegmentedDecodeGraph, HostStep
from runner.experts.device_arena_cuda import CudaDeviceArena
from runner.experts.slot_cache import ExpertSlotCache
from runner.experts.offload import OffloadConfig
from runner.sampling import SamplingParams

T = defaultdict(float); N = defaultdict(int)
def timed(name, fn):
    def w(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            T[name] += time.perf_counter() - t0; N[name] += 1
    return w

orig_serve = ExpertSlotCache._serve
ExpertSlotCache._serve = timed("cache._serve", orig_serve)
CudaDeviceArena.upload = timed("arena.upload", CudaDeviceArena.upload)
CudaDeviceArena.fence = timed("arena.fence", CudaDeviceArena.fence)
CudaDeviceArena.wait = timed("arena.wait", CudaDeviceArena.wait)
ExpertSlotCache.fetch_pair_addresses = timed("cache.fetch_pair_addresses", ExpertSlotCache.fetch_pair_addresses)

from runner.decode_segments import LayerTables
LayerTables.upload_table = timed("table upload", LayerTables.upload_table)
HostStep.fetch = timed("HostStep.fetch(all)", HostStep.fetch)

def _replay(self):
    experts = self.model.ops.experts
    for i, graph in enumerate(self.segments):
        t0 = time.perf_counter()
        graph.launch(stream=self.stream)
        t1 = time.perf_counter(); T["graph.launch"] += t1 - t0; N["graph.launch"] += 1
        if i < len(self.host_steps):
            step = self.host_steps[i]
            step.read_ids(self.stream)
            t2 = time.perf_counter()
            step.fetch(experts, self.stream)
            self.ids_wait_s += t2 - t1
            self.host_step_s += time.perf_counter() - t2
            T["read_ids(wait)"] += t2 - t1
    self.kv.advance(1)
    self.replays += 1
SegmentedDecodeGraph._replay = _replay

ap = argparse.ArgumentParser()
ap.add_argument("model"); ap.add_argument("--slots", default="150"); ap.add_argument("--out", required=True)
a = ap.parse_args()
args = argparse.Namespace(model=Path(a.model), vram_budget=24.0, server_ubatch=512, backend="cuda", slots=int(a.slots))
offload = OffloadConfig(cache_slots=args.slots, prefill_order="layer_major", prefill_ubatch=2048, warm_restore=True, transaction="auto")
engine, load_s = bo.load(args, offload, 1024 + 64, graphs=True)
rng = np.random.default_rng(0)
greedy = SamplingParams(temperature=0.0)
res = {}
for run in range(3):
    engine.reset()
    prompt = rng.integers(0, engine.model_config.n_vocab, size=1024).tolist()
    gen = engine.generate(prompt, 40, greedy, ignore_eos=True)
    stamps = []
    for step in gen.steps():
        if step.token is not None:
            stamps.append(time.perf_counter())
            if len(stamps) == 3:
                T.clear(); N.clear()
    tok = len(stamps) - 3
    res[f"run{run}"] = {"steady_tok_s": tok / (stamps[-1] - stamps[2]),
                        "us_per_token": {k: T[k] / tok * 1e6 for k in T}, "calls_per_token": {k: N[k] / tok for k in N}}
cache = engine.stats()["cache"]["total"]
# API costs alone
s = cp.cuda.Stream(non_blocking=True)
host = cp.cuda.alloc_pinned_memory(240)
h = np.frombuffer(host, dtype=np.uint64, count=30)
d = cp.zeros(30, dtype=cp.uint64)
di = cp.zeros(10, dtype=cp.int32)
hi = np.frombuffer(cp.cuda.alloc_pinned_memory(40), dtype=np.int32, count=10)
ev = cp.cuda.Event(disable_timing=True)
def per_call(fn, n=2000):
    for _ in range(50): fn()
    s.synchronize(); t0 = time.perf_counter()
    for _ in range(n): fn()
    t1 = time.perf_counter(); s.synchronize()
    return (t1 - t0) / n * 1e6
api = {
  "stream.record() (new event)": per_call(lambda: s.record()),
  "event.record(stream) (reused)": per_call(lambda: ev.record(s)),
  "stream.wait_event": per_call(lambda: s.wait_event(ev)),
  "ndarray.set 240B pinned": per_call(lambda: d.set(h, stream=s)),
  "memcpyAsync 240B pinned": per_call(lambda: cp.cuda.runtime.memcpyAsync(d.data.ptr, h.ctypes.data, 240, 1, s.ptr)),
  "memcpyAsync (ptr cached)": (lambda dp=d.data.ptr, hp=h.ctypes.data, sp=s.ptr: per_call(lambda: cp.cuda.runtime.memcpyAsync(dp, hp, 240, 1, sp)))(),
  "ndarray.get 40B + sync": per_call(lambda: di.get(stream=s, out=hi)),
  "memcpyAsync D2H 40B + stream sync": (lambda dp=di.data.ptr, hp=hi.ctypes.data, sp=s.ptr: per_call(lambda: (cp.cuda.runtime.memcpyAsync(hp, dp, 40, 2, sp), s.synchronize())))(),
  "with stream: (enter+exit)": per_call(lambda: s.__enter__() and s.__exit__(None, None, None)),
}
# a small graph's launch
s.begin_capture(); x = cp.zeros(16, dtype=cp.float32); [cp.add(x, 1, out=x) for _ in range(20)]; g = s.end_capture()
api["graph.launch (20 kernels)"] = per_call(lambda: g.launch(stream=s), 500)
json.dump({"load_s": load_s, "runs": res, "cache": cache, "api_us": api}, open(a.out, "w"), indent=1)
print(json.dumps({"runs": res, "api_us": api}, indent=1))
