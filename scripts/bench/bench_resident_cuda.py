"""Decode and prefill speed on the CUDA backend with every weight resident on the GPU; writes JSON.

The ceiling the offload path is measured against (issue 3). Follows shared/MEASURING.md: warm-up
discarded, median of --runs with min and max, prefill and decode reported separately with their
context depth, fresh random prompts per run. Decode: (n - 1) tokens / (time of the last - time of
the first), each token a full forward whose logits come back to the host (as the engine does).
No tokenizer is needed (random token ids), so it runs where llama_cpp is not installed.

    python -m scripts.bench.bench_resident_cuda MODEL.gguf --out bench.json [--commit SHA]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import cupy as cp
import numpy as np

from runner.backends.cuda.ops import CudaOps
from runner.backends.kv_type import kv_value_bytes
from runner.gguf_file import open_gguf
from runner.models import MoETransformer
from runner.models.config import model_config
from runner.models.weights import MoEWeights, load_weights
from scripts.bench.common import environment, summary

HBM_COPY_TB_S = 4.2  # device-to-device copy rate measured on the H200 box (DESIGN.md / issue 3)
FP16_DENSE_TFLOPS = 989.0  # H200 SXM datasheet, dense fp16/bf16 tensor throughput


def nodes_in(graph: Any) -> int | None:
    """Nodes (kernel launches and copies) in a captured CuPy graph, through the driver API; None
    where this CuPy does not expose the graph's handle."""
    handle = getattr(graph, "graph", None)
    if not isinstance(handle, int) or handle == 0:
        return None
    import ctypes

    driver = ctypes.CDLL("libcuda.so.1")
    count = ctypes.c_size_t(0)
    status = driver.cuGraphGetNodes(ctypes.c_void_p(handle), None, ctypes.byref(count))
    return int(count.value) if status == 0 else None


def decode_bytes_per_token(model: MoETransformer, context: int) -> int:
    """Weight bytes one decode token reads (dense tensors + k experts per MoE layer) plus its K/V reads."""
    cfg, w = model.cfg, model.weights
    total = 0
    for info in w.all_tensors():
        if "_exps" in info.name or info.name == "token_embd.weight" or info.name.startswith(f"blk.{cfg.n_layer}."):
            continue
        total += info.nbytes
    for lw in w.layers:
        if isinstance(lw.ffn, MoEWeights):
            per_expert = sum(t.nbytes // cfg.n_expert for t in (lw.ffn.gate_exps, lw.ffn.up_exps, lw.ffn.down_exps))
            total += cfg.n_expert_used * per_expert
    total += 2 * cfg.n_layer * context * cfg.n_head_kv * cfg.head_dim * kv_value_bytes(model.ops.kv_type)
    return total


def macs_per_prompt_token(model: MoETransformer) -> int:
    """Multiply-adds of one prompt token's products: dense tensors and k experts (not the LM head,
    which prefill runs for the last row only)."""
    cfg, w = model.cfg, model.weights
    macs = 0
    for info in w.all_tensors():
        if len(info.shape) < 2 or info.name in ("token_embd.weight", "output.weight"):
            continue
        if info.name.startswith(f"blk.{cfg.n_layer}."):  # the NextN block does not run in prefill
            continue
        if "_exps" in info.name:
            macs += cfg.n_expert_used * info.shape[1] * info.shape[2]
        else:
            macs += info.shape[0] * info.shape[1]
    return macs


def run_prefill(model: MoETransformer, n_tokens: int, ubatch: int, rng: np.random.Generator) -> float:
    kv = model.new_kv_cache(n_tokens + 8)
    tokens = rng.integers(0, model.cfg.n_vocab, size=n_tokens)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for start in range(0, n_tokens, ubatch):
        logits, _ = model.forward(tokens[start : start + ubatch], kv)
    model.ops.to_host(logits)
    elapsed = time.perf_counter() - t0
    del kv
    return elapsed


def run_decode(model: MoETransformer, kv, context: int, n_tokens: int, rng: np.random.Generator) -> float:
    """Seconds per token of engine-style decode (ops.decode_forward: a CUDA graph replay when enabled)."""
    kv.truncate(context)
    token = int(rng.integers(0, model.cfg.n_vocab))
    stamps = []
    for _ in range(n_tokens):
        logits, _ = model.ops.decode_forward(model, token, kv)
        token = int(np.argmax(model.ops.to_host(logits)[-1]))
        stamps.append(time.perf_counter())
    return (stamps[-1] - stamps[0]) / (n_tokens - 1)


def decode_overhead(model: MoETransformer, kv, context: int, n_tokens: int, runs: int,
                    rng: np.random.Generator) -> dict:
    """Host overhead per token: graph replay wall time minus its GPU time (CUDA events), and eager
    (no graph: every kernel launched from Python) against replay; the graph's node count is the
    number of launches one token makes."""
    ops = model.ops
    graph = ops.decode_graph(kv)
    ops.replay_times_ms = []
    wall = [run_decode(model, kv, context, n_tokens, rng) * 1e3 for _ in range(runs)]
    gpu = list(ops.replay_times_ms)
    ops.replay_times_ms = None
    ops.graphs = False
    eager = [run_decode(model, kv, context, n_tokens, rng) * 1e3 for _ in range(runs)]
    ops.graphs = True
    return {"context": context, "graph_nodes_per_token": nodes_in(graph.graph),
            "graph_wall_ms_per_token": summary(wall), "graph_gpu_ms_per_token": summary(gpu),
            "host_overhead_ms_per_token": statistics.median(wall) - statistics.median(gpu),
            "eager_wall_ms_per_token": summary(eager),
            "eager_host_overhead_ms_per_token": statistics.median(eager) - statistics.median(gpu)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit", default=None, help="default: the checkout's (git rev-parse HEAD)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--decode-contexts", default="128,4096")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--prefill-lengths", default="512,2048,8192")
    ap.add_argument("--ubatch", type=int, default=2048)
    ap.add_argument("--prefill-precision", default="f16", choices=["f16", "f32"])
    ap.add_argument("--cache-type", default="f16", choices=["f16", "f32"], help="the K/V cache's element type")
    ap.add_argument("--profile-tokens", type=int, default=0,
                    help="after the measurements, decode this many tokens at the first context inside "
                         "cudaProfilerStart/Stop (for `ncu --profile-from-start off`: scripts/bench/kernel_table.py)")
    args = ap.parse_args()

    t_load = time.perf_counter()
    f = open_gguf(args.model)
    cfg = model_config(f)
    weights = load_weights(f, cfg)
    ops = CudaOps(prefill_precision=args.prefill_precision, kv_type=args.cache_type)
    ops.check_weights(weights.all_tensors())
    model = MoETransformer(cfg, weights, ops)
    load_s = time.perf_counter() - t_load
    rng = np.random.default_rng(0)
    contexts = [int(c) for c in args.decode_contexts.split(",")]
    lengths = [int(n) for n in args.prefill_lengths.split(",")]

    prefill = {}
    for n in lengths:
        run_prefill(model, min(n, args.ubatch), args.ubatch, rng)  # warm-up, discarded
        times = [run_prefill(model, n, args.ubatch, rng) for _ in range(args.runs)]
        tok_s = [n / t for t in times]
        flops = 2 * (macs_per_prompt_token(model) * n + cfg.n_vocab * cfg.n_embd)
        flops += cfg.n_layer * 4 * cfg.n_head * cfg.head_dim * n * (n + 1) // 2  # causal QK^T and PV
        med = statistics.median(times)
        prefill[str(n)] = {"seconds": summary(times), "tok_s": summary(tok_s), "tflops": flops / med / 1e12,
                           "fraction_of_fp16_dense_peak": flops / med / 1e12 / FP16_DENSE_TFLOPS}

    decode = {}
    kv = model.new_kv_cache(max(contexts) + args.decode_tokens + 8)
    fill = rng.integers(0, cfg.n_vocab, size=max(contexts))
    for c in sorted(contexts):
        kv.truncate(min(kv.n_tokens, c))  # decoding past the last context left tokens beyond it
        for start in range(kv.n_tokens, c, args.ubatch):  # prefill up to this context depth
            model.forward(fill[start : min(c, start + args.ubatch)], kv)
        run_decode(model, kv, c, 8, rng)  # warm-up
        per_token = [run_decode(model, kv, c, args.decode_tokens, rng) for _ in range(args.runs)]
        nbytes = decode_bytes_per_token(model, c)
        med = statistics.median(per_token)
        decode[str(c)] = {"ms_per_token": summary([t * 1e3 for t in per_token]),
                          "tok_s": summary([1.0 / t for t in per_token]), "bytes_per_token": nbytes,
                          "tb_s": nbytes / med / 1e12, "fraction_of_hbm_copy_rate": nbytes / med / 1e12 / HBM_COPY_TB_S}
    overhead = decode_overhead(model, kv, contexts[0], args.decode_tokens, args.runs, rng)
    if args.profile_tokens:
        cp.cuda.Device().synchronize()
        cp.cuda.profiler.start()
        run_decode(model, kv, contexts[0], args.profile_tokens, rng)
        cp.cuda.Device().synchronize()
        cp.cuda.profiler.stop()

    record = {
        "benchmark": "resident_cuda", "environment": environment(args.commit, vars(args)), "model": args.model.name,
        "model_bytes": args.model.stat().st_size, "arch": cfg.arch, "n_layer": cfg.n_layer, "n_expert": cfg.n_expert,
        "n_expert_used": cfg.n_expert_used, "load_s": load_s, "weights_device_bytes": ops.weights.nbytes,
        "runs": args.runs, "ubatch": args.ubatch, "decode_tokens": args.decode_tokens,
        "prefill_precision": args.prefill_precision,
        "hbm_copy_tb_s_reference": HBM_COPY_TB_S, "fp16_dense_tflops_reference": FP16_DENSE_TFLOPS,
        "prefill": prefill, "decode": decode, "decode_overhead": overhead,
    }
    args.out.write_text(json.dumps(record, indent=2))
    print(json.dumps({"prefill_tok_s": {k: v["tok_s"]["median"] for k, v in prefill.items()},
                      "decode_tok_s": {k: v["tok_s"]["median"] for k, v in decode.items()},
                      "decode_hbm_fraction": {k: v["fraction_of_hbm_copy_rate"] for k, v in decode.items()},
                      "overhead": overhead}))


if __name__ == "__main__":
    main()
