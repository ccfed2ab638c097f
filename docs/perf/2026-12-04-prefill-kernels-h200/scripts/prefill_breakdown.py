"""Where an 8k layer-major prefill's GPU time goes, op by op, on the CUDA backend (seed8, 150 slots, 24 GiB).

Ad hoc device probe for issue 19 (not a project benchmark): every CudaOps method the model calls, and
inside the MoE op moe_prefill's parts, is bracketed by CUDA events on the current stream (no syncs
added); after each prompt the elapsed times are summed per op. Nested brackets (moe contains its
parts) are reported separately, so the parts add up to the moe line, not to the total. Prints JSON.
"""
import argparse, collections, json, time
import cupy as cp
import numpy as np

from runner.backends.cuda import moe_prefill as mp
from runner.backends.cuda import ops as cuda_ops
from scripts.bench import bench_offload as bo
from runner.offload.offload import OffloadConfig

SPANS = collections.defaultdict(list)


def bracket(name, fn):
    def wrapped(*a, **k):
        s = cp.cuda.get_current_stream()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        out = fn(*a, **k)
        e1.record(s)
        SPANS[name].append((e0, e1))
        return out
    return wrapped


for name in ("concat_rows", "embed", "linear", "rms_norm", "rope_neox", "attention", "swiglu", "route", "moe", "kv_store"):
    setattr(cuda_ops.CudaOps, name, bracket(name, getattr(cuda_ops.CudaOps, name)))
mp.ExpertMatrixSet.dense = bracket("moe.dequant", mp.ExpertMatrixSet.dense)
mp.group_by_expert = bracket("moe.group", mp.group_by_expert)
cuda_ops.moe_prefill = bracket("moe.prefill_all", cuda_ops.moe_prefill)

ap = argparse.ArgumentParser()
ap.add_argument("model"); ap.add_argument("--tokens", type=int, default=8192); ap.add_argument("--out", required=True)
ap.add_argument("--no-fuse", action="store_true")
a = ap.parse_args()
args = argparse.Namespace(model=a.model, vram_budget=24.0, server_ubatch=512, backend="cuda", slots=150)
offload = OffloadConfig(cache_slots=150, prefill_order="layer_major", prefill_ubatch=2048, warm_restore=False,
                        transaction="always")
engine, _ = bo.load(args, offload, a.tokens + 16)
rng = np.random.default_rng(0)
runs = []
for run in range(3):
    engine.reset()
    SPANS.clear()
    tokens = rng.integers(0, engine.model_config.n_vocab, size=a.tokens).tolist()
    t0 = time.perf_counter()
    engine.prefill(tokens)
    wall = time.perf_counter() - t0
    cp.cuda.Device().synchronize()
    ms = {k: sum(cp.cuda.get_elapsed_time(e0, e1) for e0, e1 in v) for k, v in SPANS.items()}
    calls = {k: len(v) for k, v in SPANS.items()}
    runs.append({"wall_s": wall, "ms": ms, "calls": calls})
    print(json.dumps({"run": run, "wall_s": round(wall, 3), "ms": {k: round(v, 1) for k, v in sorted(ms.items(), key=lambda kv: -kv[1])}}))
json.dump({"model": str(a.model), "tokens": a.tokens, "layers": engine.model_config.n_layer, "runs": runs}, open(a.out, "w"), indent=1)
