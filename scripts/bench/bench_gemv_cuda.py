"""Time runner.backends.cuda.gemv's kernels on the GPU: microseconds per launch and weight GB/s, as JSON.

Usage: python -m scripts.bench.bench_gemv_cuda [--repeat 30] [--quick] [--both-layouts] [--grid-types | --seed-shapes]
    [--columns-threads 512,128,128x2] [--out bench.json]
Each launch is timed alone with CUDA events, queued behind a ~100 us spin kernel so that host launch
overhead is not in the interval; one warm-up launch per case is discarded. Weights rotate over
copies (experts: over 128 experts) holding at least --rotate-mib MiB, so they come from HBM and not
from the 50 MB L2. GB/s counts the weight bytes read once per launch; x, y and the pair tables are
left out (they are small). `hbm_fraction` is GB/s over --hbm-GBps (a device-to-device copy's rate,
measured on this box as 4.2 TB/s and re-measured here as copy_GBps). --both-layouts also times
each case in the type's other layout (gemv_cuda.LAYOUTS), the evidence for the choice. --grid-types times
the IQ1/IQ2/IQ3 grid types and TQ1_0/TQ2_0 (blocks.cuh's decoders read byte by byte) instead;
--columns-threads times every case at each of those gemv_cuda.COLUMNS_THREADS (the columns layout's CTA size),
THREADSx2 with COLUMNS_PER_THREAD 2;
--seed-shapes the products of a seed48 decode token (Q4_K_M: hidden 2048, 512 experts of 512, top-10),
beside an empty kernel timed the same way: the floor of this method, which the small launches sit near.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import cupy as cp
import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT

from runner.backends.cuda import gemv as gemv_cuda
from runner.backends.cuda.gemv import expert_gate_up, expert_gemv, gemv, gemv_multi
from scripts.bench.common import environment, spin_kernel

_SPIN = spin_kernel()
_SPIN_CYCLES = 200_000  # ~100 us at ~2 GHz: longer than queueing the timed launch takes

# (qtype, N, K): dense matrices of a decode step. 1408 is GLM-4.5-Air's expert width; its down
# projections (rows of 1408) cannot be K-quants (not a multiple of 256): llama.cpp stores Q6_K's as
# Q8_0 and Q4_K's as Q5_0.
GEMV_CASES = [
    (QT.Q4_K, 4096, 4096), (QT.Q5_K, 4096, 4096), (QT.Q6_K, 4096, 4096), (QT.Q8_0, 4096, 4096),
    (QT.Q4_0, 4096, 4096), (QT.IQ4_XS, 4096, 4096), (QT.F16, 4096, 4096), (QT.BF16, 4096, 4096),
    (QT.F32, 4096, 4096), (QT.Q6_K, 151552, 4096), (QT.Q4_K, 4096, 14336),
]
EXPERT_CASES = [(QT.Q4_K, 1408, 4096), (QT.Q8_0, 4096, 1408), (QT.Q5_0, 4096, 1408)]  # gate/up, down x2
GATE_UP_CASES = [(QT.Q4_K, 1408, 4096)]
GRID_GEMV_CASES = [(qtype, 4096, 4096) for qtype in (QT.IQ1_S, QT.IQ1_M, QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ3_XXS,
                                                     QT.IQ3_S, QT.TQ1_0, QT.TQ2_0)]
GRID_EXPERT_CASES = [(QT.IQ2_XXS, 1408, 4096), (QT.IQ1_S, 1408, 4096), (QT.IQ3_S, 1408, 4096)]
GRID_GATE_UP_CASES = [(QT.IQ2_XXS, 1408, 4096)]
# seed48's decode token (Q4_K_M): q and o, k, v (Q6_K on llama.cpp's use_more_bits layers), the F32 router, the
# Q6_K LM head; the routed experts' gate+up and down (Q6_K on the same layers) at 10 pairs, 11 with the shared one.
SEED_GEMV_CASES = [(QT.Q4_K, 2048, 2048), (QT.Q4_K, 512, 2048), (QT.Q6_K, 512, 2048), (QT.F32, 512, 2048),
                   (QT.Q6_K, 151552, 2048)]
SEED_EXPERT_CASES = [(QT.Q4_K, 2048, 512), (QT.Q6_K, 2048, 512)]
SEED_GATE_UP_CASES = [(QT.Q4_K, 512, 2048)]
SEED_PAIRS = (10, 11)
# attention's q, k and v in one gemv_multi launch (v Q4_K or, on use_more_bits layers, Q6_K)
SEED_MULTI_CASES = [((QT.Q4_K, QT.Q4_K, QT.Q4_K), (2048, 512, 512), 2048), ((QT.Q4_K, QT.Q4_K, QT.Q6_K), (2048, 512, 512), 2048)]
N_EXPERT = 128
OTHER = {"columns": "units", "units": "columns"}


def row_bytes(qtype: QT, k: int) -> int:
    block, type_size = GGML_QUANT_SIZES[qtype]
    return k // block * type_size


def random_bytes(n: int, k: int, qtype: QT) -> cp.ndarray:
    """Random blocks: timing does not depend on the values (a few scales may be inf or NaN)."""
    raw = cp.random.randint(0, 256, size=(n, row_bytes(qtype, k)), dtype=cp.uint8)
    if qtype in (QT.F16, QT.BF16, QT.F32):  # keep floats finite anyway: clear the top exponent bit
        raw.view(cp.uint16 if qtype != QT.F32 else cp.uint32)[...] &= 0xBFFF if qtype != QT.F32 else 0xBFFFFFFF
    return raw


def time_launches_us(launch, repeat: int) -> list[float]:
    """launch(i) enqueues the i-th call; returns `repeat` event-timed durations after one warm-up."""
    launch(0)
    cp.cuda.Device().synchronize()
    times = []
    for i in range(1, repeat + 1):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        _SPIN((1,), (1,), (np.int64(_SPIN_CYCLES),))
        start.record()
        launch(i)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e3)
    return times


def record(kind: str, qtype: QT, n: int, k: int, rows: int, weight_bytes: int, times: list[float], hbm: float) -> dict:
    median = statistics.median(times)
    gbps = weight_bytes / (median * 1e-6) / 1e9
    entry = {
        "kind": kind, "qtype": qtype.name, "layout": gemv_cuda.LAYOUTS[qtype], "N": n, "K": k,
        "rows" if kind.startswith("gemv") else "pairs": rows,
        "weight_bytes": weight_bytes, "median_us": round(median, 2), "min_us": round(min(times), 2),
        "max_us": round(max(times), 2), "launches": len(times), "GBps": round(gbps, 1),
        "hbm_fraction": round(gbps / hbm, 3),
    }
    print(json.dumps(entry), flush=True)
    return entry


def bench_gemv(qtype: QT, n: int, k: int, rows_list, repeat: int, rotate_bytes: int, hbm: float) -> list[dict]:
    one = n * row_bytes(qtype, k)
    copies = [random_bytes(n, k, qtype) for _ in range(max(1, -(-rotate_bytes // one)))]
    out = []
    for rows in rows_list:
        x = cp.random.standard_normal((rows, k), dtype=cp.float32)
        y = cp.empty((rows, n), cp.float32)
        times = time_launches_us(lambda i: gemv(x, copies[i % len(copies)], qtype, k, out=y), repeat)
        out.append(record("gemv", qtype, n, k, rows, one, times, hbm))
    copies.clear()  # the rotation's device bytes go before the next case allocates its own
    return out


def bench_multi(qtypes: tuple[QT, ...], ns: tuple[int, ...], k: int, rows_list, repeat: int, rotate_bytes: int,
                hbm: float) -> list[dict]:
    """gemv_multi over the matrices (one launch), beside the same products as separate gemv launches."""
    one = sum(n * row_bytes(q, k) for q, n in zip(qtypes, ns))
    copies = [[(random_bytes(n, k, q), q) for q, n in zip(qtypes, ns)] for _ in range(max(1, -(-rotate_bytes // one)))]
    out = []
    for rows in rows_list:
        x = cp.random.standard_normal((rows, k), dtype=cp.float32)
        none = [None] * len(qtypes)
        times = time_launches_us(lambda i: gemv_multi(x, copies[i % len(copies)], none), repeat)
        separate = time_launches_us(lambda i: [gemv(x, w, q, k) for w, q in copies[i % len(copies)]], repeat)
        entry = record("gemv_multi", qtypes[-1], sum(ns), k, rows, one, times, hbm)
        entry.update(qtypes=[q.name for q in qtypes], Ns=list(ns), separate_median_us=round(statistics.median(separate), 2))
        print(json.dumps({"separate_median_us": entry["separate_median_us"]}), flush=True)
        out.append(entry)
    copies.clear()
    return out


def bench_experts(qtype: QT, n: int, k: int, pairs_list, repeat: int, hbm: float, gate_up: bool) -> list[dict]:
    rb = row_bytes(qtype, k)
    gate = random_bytes(N_EXPERT * n, k, qtype)
    up = random_bytes(N_EXPERT * n, k, qtype) if gate_up else gate
    expert_bytes = n * rb
    out = []
    for pairs in pairs_list:
        n_tok = max(1, pairs // 8)  # top-8 routing: 8 pairs per token
        x = cp.random.standard_normal((n_tok, k), dtype=cp.float32)
        rows = cp.asarray(np.repeat(np.arange(n_tok, dtype=np.int32), pairs // n_tok))
        # launch i uses experts (i * pairs + j) % 128, so consecutive launches read different experts
        tables = []
        for i in range(N_EXPERT):
            experts = (np.arange(pairs) + i * pairs) % N_EXPERT
            offsets = experts.astype(np.uint64) * np.uint64(expert_bytes)
            tables.append((cp.asarray(np.uint64(gate.data.ptr) + offsets), cp.asarray(np.uint64(up.data.ptr) + offsets)))
        y = cp.empty((pairs, n), cp.float32)
        if gate_up:
            def launch(i):
                g, u = tables[i % len(tables)]
                expert_gate_up(x, rows, g, u, qtype, qtype, n, k, out=y)
        else:
            def launch(i):
                expert_gemv(x, rows, tables[i % len(tables)][0], qtype, n, k, out=y)
        times = time_launches_us(launch, repeat)
        matrices = 2 if gate_up else 1
        out.append(record("expert_gate_up" if gate_up else "expert_gemv", qtype, n, k, pairs,
                          matrices * pairs * expert_bytes, times, hbm))
    return out


def empty_kernel_us(repeat: int) -> float:
    """An empty kernel's interval between the events: what the method adds to every launch it times."""
    kernel = cp.RawKernel(r'extern "C" __global__ void empty_kernel() {}', "empty_kernel")
    return round(statistics.median(time_launches_us(lambda i: kernel((1,), (32,), ()), repeat)), 2)


def copy_gbps(repeat: int) -> float:
    """Device-to-device copy of 1 GiB: bytes read plus bytes written per second."""
    a = cp.empty(1 << 30, cp.uint8)
    b = cp.empty_like(a)
    times = time_launches_us(lambda i: b.data.copy_from_device(a.data, a.nbytes), repeat)
    return 2 * a.nbytes / (statistics.median(times) * 1e-6) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30, help="timed launches per case (after one warm-up)")
    parser.add_argument("--rotate-mib", type=float, default=256.0, help="weight bytes the launches rotate over")
    parser.add_argument("--hbm-GBps", type=float, default=4200.0, help="the copy rate fractions are taken of")
    parser.add_argument("--quick", action="store_true", help="rows 1, 4, 8 and pairs 8, 32 only")
    parser.add_argument("--both-layouts", action="store_true", help="also time each type's other layout")
    parser.add_argument("--grid-types", action="store_true", help="time the IQ1/IQ2/IQ3 and TQ types instead")
    parser.add_argument("--seed-shapes", action="store_true", help="time seed48's decode products instead")
    parser.add_argument("--columns-threads", default=str(gemv_cuda.COLUMNS_THREADS),
                        help="comma-separated COLUMNS_THREADS to time every case at, THREADSx2 for 2 columns a thread")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    assert args.repeat >= 20, "report at least 20 timed launches per case"
    hbm, rotate = args.hbm_GBps, int(args.rotate_mib * 2**20)
    rows_list = (1, 4, 8) if args.quick else (1, 2, 3, 4, 8)
    report = {
        "environment": environment(argv=vars(args)), "repeat": args.repeat, "rotate_MiB": args.rotate_mib,
        "hbm_GBps": hbm, "copy_GBps": round(copy_gbps(args.repeat), 1),
        "empty_kernel_us": empty_kernel_us(args.repeat), "cases": [],
    }
    assert not (args.grid_types and args.seed_shapes), "--grid-types or --seed-shapes, not both"
    gemv_cases, expert_cases, gate_up_cases = (
        (GRID_GEMV_CASES, GRID_EXPERT_CASES, GRID_GATE_UP_CASES) if args.grid_types
        else (SEED_GEMV_CASES, SEED_EXPERT_CASES, SEED_GATE_UP_CASES) if args.seed_shapes
        else (GEMV_CASES, EXPERT_CASES, GATE_UP_CASES))
    pairs_list = SEED_PAIRS if args.seed_shapes else (8, 32)
    chosen, chosen_threads, chosen_per = dict(gemv_cuda.LAYOUTS), gemv_cuda.COLUMNS_THREADS, gemv_cuda.COLUMNS_PER_THREAD
    for setting in args.columns_threads.split(","):
        threads, _, per_thread = setting.partition("x")
        threads, per_thread = int(threads), int(per_thread or 1)
        gemv_cuda.COLUMNS_THREADS, gemv_cuda.COLUMNS_PER_THREAD = threads, per_thread
        for layout_of in [chosen] + ([{q: OTHER[layout] for q, layout in chosen.items()}] if args.both_layouts else []):
            gemv_cuda.LAYOUTS.update(layout_of)
            cases = []
            for qtype, n, k in gemv_cases:
                cases += bench_gemv(qtype, n, k, rows_list, args.repeat, rotate, hbm)
            for qtype, n, k in expert_cases:
                cases += bench_experts(qtype, n, k, pairs_list, args.repeat, hbm, gate_up=False)
            for qtype, n, k in gate_up_cases:
                cases += bench_experts(qtype, n, k, pairs_list, args.repeat, hbm, gate_up=True)
            for qtypes, ns, k in SEED_MULTI_CASES if args.seed_shapes else ():
                cases += bench_multi(qtypes, ns, k, rows_list, args.repeat, rotate, hbm)
            report["cases"] += [dict(case, columns_threads=threads, columns_per_thread=per_thread) for case in cases]
    gemv_cuda.COLUMNS_THREADS, gemv_cuda.COLUMNS_PER_THREAD = chosen_threads, chosen_per
    gemv_cuda.LAYOUTS.update(chosen)
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(f"copy {report['copy_GBps']} GB/s; empty kernel {report['empty_kernel_us']} us; {len(report['cases'])} cases")


if __name__ == "__main__":
    main()
