"""Speed of the hybrids' DeltaNet kernels (runner.backends.cuda.delta_net) on the GPU, per layer, at a
published shape (qwen35-35b-a3b: 16 key / 32 value heads of 128, conv 8192; qwen35-397b-a17b: 64 value
heads); JSON out.

    python -m scripts.bench.bench_delta_net_cuda [--shape 35b|397b] [--repeat 30] [--out bench.json]

For each T (1: decode; 4, 8: verify batches keeping every row's state; 512, 2048, 8192: prompts): the scan's
time (gated_delta_net with tensor cores off), its state bytes moved (read once, written once per kept row) as
GB/s against ~4.2 TB/s of HBM, and its tokens/s; at prompt sizes the chunked tensor-core kernels' time
beside it (gated_delta_net_chunked, what prompts of CHUNKED_MIN_TOKENS or more take), their speedup and
their largest output difference from the scan; ssm_conv's time. Timing as bench_attention_cuda: a spin
kernel holds the GPU while every timed call is enqueued; median, min and max of --repeat calls.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import cupy as cp

from runner.backends.cuda import delta_net as delta_net_cuda
from scripts.bench.bench_attention_cuda import HBM_TB_S, summary_ms, time_calls_ms
from scripts.bench.common import environment, write_result

SHAPES = {"35b": (16, 32, 128, 8192), "397b": (16, 64, 128, 12288)}  # H_k, H_v, S, conv channels
TOKENS = (1, 4, 8, 512, 2048, 8192)
CONV_KERNEL = 4


def bench(shape: tuple[int, int, int, int], n_tok: int, repeat: int) -> dict:
    h_k, h_v, dim, channels = shape
    rand = cp.random.standard_normal
    q = delta_net_cuda.l2_norm(rand((n_tok, h_k, dim), dtype=cp.float32), 1e-6)
    k = delta_net_cuda.l2_norm(rand((n_tok, h_k, dim), dtype=cp.float32), 1e-6)
    v = rand((n_tok, h_v, dim), dtype=cp.float32)
    g = -cp.random.uniform(0.01, 1.0, (n_tok, h_v)).astype(cp.float32)
    beta = cp.random.uniform(0.0, 1.0, (n_tok, h_v)).astype(cp.float32)
    state = rand((h_v, dim, dim), dtype=cp.float32) * cp.float32(0.3)
    keep = n_tok <= 8

    def scan():
        return delta_net_cuda.gated_delta_net(q, k, v, g, beta, state, False, keep, tensor_cores=False)

    ms = summary_ms(time_calls_ms(scan, repeat, None))
    state_bytes = h_v * dim * dim * 4 * (1 + (n_tok if keep else 1))
    x = rand((n_tok, channels), dtype=cp.float32)
    conv_state = rand((CONV_KERNEL - 1, channels), dtype=cp.float32)
    w = rand((channels, CONV_KERNEL), dtype=cp.float32)
    conv_ms = summary_ms(time_calls_ms(lambda: delta_net_cuda.ssm_conv(x, conv_state, w), repeat, None))
    gbps = state_bytes / (ms["median"] * 1e-3) / 1e9
    row = {"T": n_tok, "keep_states": keep, "scan_ms": ms, "state_bytes": state_bytes,
           "GBps": round(gbps, 1), "of_hbm": round(gbps / (HBM_TB_S * 1e3), 3),
           "tok_s": round(n_tok / (ms["median"] * 1e-3)), "ssm_conv_ms": conv_ms}
    if not keep and delta_net_cuda.chunked_fits(dim):
        def chunked():
            return delta_net_cuda.gated_delta_net_chunked(q, k, v, g, beta, state, False)

        chunked_ms = summary_ms(time_calls_ms(chunked, repeat, None))
        row.update(chunked_ms=chunked_ms, chunked_tok_s=round(n_tok / (chunked_ms["median"] * 1e-3)),
                   chunked_speedup=round(ms["median"] / chunked_ms["median"], 2),
                   chunked_max_abs_diff=float(cp.abs(chunked()[0] - scan()[0]).max()))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="35b")
    parser.add_argument("--repeat", type=int, default=30, help="timed calls per case")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here")
    parser.add_argument("--commit", default=None, help="the commit measured (default: the checkout's)")
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    cp.random.seed(0)
    rows = []
    for n_tok in TOKENS:
        rows.append(bench(shape, n_tok, args.repeat))
        print(json.dumps(rows[-1]), flush=True)
    result = {"environment": environment(args.commit, vars(args)), "hbm_TB_s": HBM_TB_S,
              "shape": dict(zip(("H_k", "H_v", "S", "conv_channels"), shape)), "repeat": args.repeat, "rows": rows}
    write_result(result, args.out)


if __name__ == "__main__":
    main()
