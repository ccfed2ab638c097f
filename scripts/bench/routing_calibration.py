"""The locality routing presets calibrated for model shapes, and the decode hit rates they imply; writes JSON.

Per preset and shape: the fitted process (runner/offload/locality_routing.py: calibrate) with its
simulated cold-cache hit rates at the preset's points, and the expected hit rate of bench_offload's
decode arm at each slot count: the cache warmed by the `--warm` positions before the prompt's end
(what a warm restore after a long prompt approximates), then `--tokens` decode positions counted,
mean over `--layers` simulated layers. No model is loaded: this is the process alone, to set beside
the GPU box's measured hit rates.

    python -m scripts.bench.routing_calibration --shape 512x10 --shape 128x8 --slots 50,150 --out cal.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from runner.offload.locality_routing import PRESETS, calibrate, lru_hit_rate
from scripts.bench.common import environment


def expected_decode_hit_rate(preset: str, n_expert: int, k: int, slots: int, warm: int, tokens: int,
                             layers: int) -> float:
    c = calibrate(preset, n_expert, k)
    ids = c.process.generate(n_expert, k, warm + tokens, layers)
    return statistics.fmean(lru_hit_rate(ids[i], slots, n_expert, count_from=warm) for i in range(layers))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", required=True, help="N_EXPERTxTOP_K, e.g. 512x10 (repeatable)")
    ap.add_argument("--preset", action="append", choices=sorted(PRESETS), help="default: every preset")
    ap.add_argument("--slots", default="50,150", help="slot counts per layer for the expected decode hit rate")
    ap.add_argument("--warm", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shape]
    slot_counts = [int(s) for s in args.slots.split(",")]
    out = []
    for preset in args.preset or list(PRESETS):
        for n_expert, k in shapes:
            t0 = time.perf_counter()
            c = calibrate(preset, n_expert, k)
            fit_s = time.perf_counter() - t0
            expected = {s: expected_decode_hit_rate(preset, n_expert, k, s, args.warm, args.tokens, args.layers)
                        for s in slot_counts if k <= s}
            out.append({**c.to_dict(), "fit_s": fit_s, "expected_decode_hit_rate": expected,
                        "uniform_routing_hit_rate": {s: min(1.0, s / n_expert) for s in expected}})
            print(json.dumps(out[-1]), flush=True)
    args.out.write_text(json.dumps({"benchmark": "routing_calibration", "calibrations": out,
                                    "environment": environment(None, vars(args))}, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
