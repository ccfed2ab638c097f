"""`runner profile`'s figures: where the time to first token went and what crossed PCIe, as JSON and a table.

Built from three snapshots of `engine.stats()` (before the prompt, at the first token, at the end),
the stream timeline's spans and the model's expert layout. Every figure the table prints is in the
JSON; the table is made from the JSON alone.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from runner.offload.figures import request_figures
from runner.offload.timeline import Span
from runner.units import size_text

LOCALITY_NOTE = "random-weight models have no real routing locality: their hit rates are not a real model's"


@dataclass
class ProfileRun:
    """What one profiled prompt and generation measured."""

    prompt_tokens: int
    new_tokens: int
    ttft_s: float
    generated: int
    decode_s: float
    before: dict[str, Any]
    at_first: dict[str, Any]
    after: dict[str, Any]
    spans: list[Span] = field(default_factory=list)
    draft: dict[str, Any] | None = None
    replay_gpu_ms: list[float] | None = None  # each whole-step decode graph replay's GPU time (CUDA), else None
    token_ids: list[int] = field(default_factory=list)  # the generated ids (greedy), for comparing arms' tokens


def tokens_digest(ids: list[int]) -> str:
    """SHA-256 of the ids written as decimal, comma-separated: equal digests mean equal tokens, so two runs of
    the same prompt under different builds can be compared to the token without keeping the ids."""
    return hashlib.sha256(",".join(str(int(i)) for i in ids).encode()).hexdigest()


def build_report(run: ProfileRun, layers: dict[int, dict[str, int]], clock: dict[str, Any]) -> dict[str, Any]:
    """The profile as one JSON-ready dict. `layers`: per streamed MoE layer, set_bytes and expert_bytes."""
    pre = request_figures(run.before, run.at_first)
    dec = request_figures(run.at_first, run.after)
    assert pre is not None and dec is not None, "profile needs expert offload"
    set_bytes = sum(v["set_bytes"] for v in layers.values())
    return {
        "prompt": {"tokens": run.prompt_tokens, "new_tokens": run.new_tokens},
        "ttft_s": run.ttft_s,
        "prefill_tok_s": run.new_tokens / run.ttft_s if run.ttft_s > 0 else 0.0,
        "prefill": _prefill(run, pre, layers, set_bytes),
        "timing": _timing(run, clock, pre["prefill_bytes"]),
        "phase": _phase(pre, run.at_first),
        "decode": _decode(run, dec),
        "draft": run.draft,
        "timeline": [s.to_dict() for s in run.spans],
    }


def _prefill(run: ProfileRun, pre: dict[str, Any], layers: dict[int, dict[str, int]], set_bytes: int) -> dict:
    p = run.at_first["prefill"]
    streamed = pre["phase_begins"] > 0
    chunks = math.ceil(run.new_tokens / p["ubatch"])
    per_layer = []
    ran = p["last_prompt"]["per_layer"] if streamed else {}
    for layer, facts in layers.items():
        got = ran.get(layer, {"visits": 0, "bytes": 0, "experts": 0, "skipped": 0, "routed": 0})
        # Experts the cache held at each visit are skipped; the other order would skip them per visit too.
        skip_per_visit = got["skipped"] * facts["expert_bytes"] // got["visits"] if got["visits"] else 0
        one_visit = facts["set_bytes"] - skip_per_visit
        per_layer.append({"layer": layer, "set_bytes": facts["set_bytes"], "visits": got["visits"],
                          "bytes": got["bytes"], "expert_sets": got["bytes"] / facts["set_bytes"],
                          "skipped_experts": got["skipped"], "routed_experts": got["routed"],
                          "routed_bytes": got["routed"] * facts["expert_bytes"],
                          "per_microbatch_would_bytes": one_visit * chunks,
                          "layer_major_would_bytes": one_visit})
    would_pmb = sum(r["per_microbatch_would_bytes"] for r in per_layer)
    would_lm = sum(r["layer_major_would_bytes"] for r in per_layer)
    routed = sum(r["routed_bytes"] for r in per_layer)
    return {
        "path": "phase transaction" if streamed else "through the slot cache (no transaction)",
        "order": p["order"], "ubatch": p["ubatch"], "micro_batches": chunks,
        "expert_set_bytes": set_bytes,
        "stream_bytes": pre["prefill_bytes"], "expert_sets": pre["prefill_expert_sets"],
        "cache_miss_bytes": pre["cache_miss_bytes"], "warm_bytes": pre["warm_bytes"],
        "warm_device_bytes": pre["warm_device_bytes"],
        "warm_fill": p["warm_fill"],  # the mode and, since load (warm-ups too), prompts staged and fallen back
        "bytes": pre["bytes_uploaded"], "uploaded_expert_sets": pre["bytes_uploaded"] / set_bytes,
        "per_microbatch_would_bytes": would_pmb, "per_microbatch_would_expert_sets": would_pmb / set_bytes,
        "layer_major_would_bytes": would_lm, "layer_major_would_expert_sets": would_lm / set_bytes,
        # The distinct experts the prompt routed to, over the set: what streaming only the used experts would
        # move in one crossing (llama.cpp's scheduler copies only the experts a micro-batch uses).
        "routed_bytes": routed, "routed_share_of_set": routed / set_bytes if set_bytes else 0.0,
        "per_layer": per_layer,
    }


def _timing(run: ProfileRun, clock: dict[str, Any], stream_bytes: int) -> dict:
    copy = _union([(s.start_s, s.end_s) for s in run.spans if s.stream == "copy"])
    compute = _union([(s.start_s, s.end_s) for s in run.spans if s.stream == "compute"])
    waits = _union([(s.start_s, s.end_s) for s in run.spans if s.stream == "wait"])
    copy_s, compute_s = _length(copy), _length(compute)
    overlap_s = _length(_intersect(copy, compute))
    # The compute stream's own time: its spans less the waits for uploads inside them (the kernels, and any
    # gap in which the host had not launched the next one yet).
    upload_wait_s = _length(_intersect(compute, waits))
    exposed = copy_s - overlap_s
    # The link's idle time between the prompt's first upload and its last (the streaming order issues them
    # back to back, so any gap is an upload that waited: on a buffer, on compute, or on the host).
    link_idle_s = (copy[-1][1] - copy[0][0]) - copy_s if copy else 0.0
    per_layer = {}
    for s in run.spans:
        row = per_layer.setdefault(s.layer, {"layer": s.layer, "copy_s": 0.0, "compute_s": 0.0, "wait_s": 0.0})
        row[f"{s.stream}_s"] += s.duration_s
    return {
        **clock, "copy_s": copy_s, "compute_s": compute_s, "upload_wait_s": upload_wait_s,
        "compute_busy_s": compute_s - upload_wait_s, "overlap_s": overlap_s, "exposed_copy_s": exposed,
        "copy_share_of_ttft": copy_s / run.ttft_s if run.ttft_s > 0 else 0.0,
        "exposed_copy_share_of_ttft": exposed / run.ttft_s if run.ttft_s > 0 else 0.0,
        "achieved_h2d_gb_s": stream_bytes / copy_s / 1e9 if copy_s > 0 else None,
        "link_idle_s": link_idle_s,
        "per_layer": [per_layer[k] for k in sorted(per_layer)],
    }


def _phase(pre: dict[str, Any], at_first: dict[str, Any]) -> dict[str, Any]:
    last = at_first["phase"]["last"] if pre["phase_begins"] else None
    return {"ran": bool(pre["phase_begins"]), "skipped": pre["phase_skipped"],
            "release_s": last["release_s"] if last else None, "prompt_s": last["prompt_s"] if last else None,
            "restore_s": last["restore_s"] if last else None, "warm_experts": last["warm_experts"] if last else None,
            "warm_bytes": pre["warm_bytes"], "warm_device_bytes": pre["warm_device_bytes"]}


def _decode(run: ProfileRun, dec: dict[str, Any]) -> dict[str, Any]:
    decoded = max(run.generated - 1, 0)  # the first token came from the prompt's logits
    return {"tokens": run.generated, "decoded_tokens": decoded, "decode_s": run.decode_s,
            "decode_tok_s": decoded / run.decode_s if run.decode_s > 0 else 0.0,
            "hits": dec["cache_hits"], "misses": dec["cache_misses"], "hit_rate": dec["cache_hit_rate"],
            "miss_bytes": dec["cache_miss_bytes"], "bytes_per_token": dec["cache_miss_bytes"] / decoded if decoded else 0.0,
            **_gpu_and_host(run, decoded), "tokens_sha256": tokens_digest(run.token_ids), "note": LOCALITY_NOTE}


def _gpu_and_host(run: ProfileRun, decoded: int) -> dict[str, Any]:
    """A decoded token's wall time split: its graphs' GPU time (CUDA events around each whole-step replay) and the
    rest, which is host time (sampling, launches, Python), or GPU time outside replayed graphs (a warm-up or
    capture step, a segmented step). None without whole-step graphs (numpy, eager, segments)."""
    if not run.replay_gpu_ms or not decoded:
        return {"graph_replays": 0, "gpu_ms_per_token": None, "host_ms_per_token": None}
    gpu_ms = sum(run.replay_gpu_ms)
    return {"graph_replays": len(run.replay_gpu_ms), "gpu_ms_per_token": gpu_ms / decoded,
            "host_ms_per_token": (run.decode_s * 1e3 - gpu_ms) / decoded}


def _fell_back(p: dict[str, Any]) -> bool:
    """The measured prompt was to fill its warm slots from staging and refilled them over the link instead."""
    return p["warm_fill"]["mode"] == "staging" and p["warm_bytes"] > 0 and bool(p["warm_fill"]["last_fallback"])


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _intersect(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


# -- the table ------------------------------------------------------------------------------------
def _opt(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_table(r: dict[str, Any]) -> str:
    """The report for a terminal: a summary block, then one row per streamed MoE layer."""
    p, t, ph, d, m = r["prefill"], r["timing"], r["phase"], r["decode"], r["model"]
    lines = [
        f"model        {m['file']} ({m['architecture']}, {m['moe_layers']} MoE layers streamed, "
        f"{m['n_expert']} experts of {size_text(m['expert_bytes'])}, top-{m['n_expert_used']}), backend {r['backend']}",
        f"launch       {r['launch']['why']}; {r['offload_stats']['cache']['slots_per_layer']} cache slots per "
        f"MoE layer ({r['offload_stats']['cache']['policy']}); K/V cache {r['launch']['backend']['kv_type']}",
        f"prompt       {r['prompt']['tokens']} tokens ({r['prompt']['new_tokens']} new); time to first token "
        f"{r['ttft_s']:.4f} s ({r['prefill_tok_s']:.1f} tok/s)"
        + (f", after {r['warmup_prompts']} warm-up prompt(s)" if r.get("warmup_prompts") else ", the process's first"),
        f"expert set   {p['expert_set_bytes']} B ({size_text(p['expert_set_bytes'])}) streamed per prompt crossing = "
        f"runner info's routed set {m['routed_set_bytes_in_file']} B less {m['routed_bytes_not_streamed']} B "
        f"of layers a prompt does not stream (NextN)",
        f"prefill      path: {p['path']}, {p['order']}, {p['micro_batches']} micro-batch(es) of {p['ubatch']}",
        f"  streamed   {p['stream_bytes']} B ({size_text(p['stream_bytes'])}) = {p['expert_sets']:.3f} expert sets; "
        f"the prompt routed to {p['routed_share_of_set']:.1%} of the set's bytes",
        f"  uploaded   {p['bytes']} B ({size_text(p['bytes'])}) = {p['uploaded_expert_sets']:.3f} expert sets "
        f"(stream + {p['cache_miss_bytes']} B cache misses + {p['warm_bytes']} B warm refill; "
        f"{p['warm_device_bytes']} B warm fill from staging, device to device)",
        *([f"  warm fill  not all from staging: {p['warm_fill']['last_fallback']}"] if _fell_back(p) else []),
        f"  orders     per_microbatch would stream {p['per_microbatch_would_bytes']} B = "
        f"{p['per_microbatch_would_expert_sets']:.3f} expert sets; layer_major {p['layer_major_would_bytes']} B = "
        f"{p['layer_major_would_expert_sets']:.3f}",
        f"phase        {'ran' if ph['ran'] else 'skipped (the cost model judged it would not pay)'}: release "
        f"{_opt(ph['release_s'], '.4f')} s, restore {_opt(ph['restore_s'], '.4f')} s, "
        f"{_opt(ph['warm_experts'], 'd')} warm experts",
        f"timing       {t['clock']}",
        f"  streams    upload {t['copy_s']:.4f} s, compute {t['compute_s']:.4f} s ({t['upload_wait_s']:.4f} s of it "
        f"waiting for uploads, {t['compute_busy_s']:.4f} s not: kernels and host gaps), overlap {t['overlap_s']:.4f} s; "
        f"upload {t['copy_share_of_ttft']:.1%} of TTFT, exposed {t['exposed_copy_s']:.4f} s = "
        f"{t['exposed_copy_share_of_ttft']:.1%}; achieved {_opt(t['achieved_h2d_gb_s'], '.2f')} GB/s"
        + (f" of the box's pinned {t['pinned_h2d_gb_s']:.2f} GB/s" if t.get("pinned_h2d_gb_s") else "")
        + f"; link idle {t['link_idle_s']:.4f} s between the first upload and the last",
        f"decode       {d['tokens']} tokens ({d['decoded_tokens']} decoded, {d['decode_tok_s']:.1f} tok/s): "
        f"{d['hits']} hits, {d['misses']} misses ({_opt(d['hit_rate'], '.1%')} hit rate*), "
        f"{d['bytes_per_token']:.0f} B per token"
        + (f"; a token {d['gpu_ms_per_token']:.3f} ms in its graphs on the GPU, {d['host_ms_per_token']:.3f} ms else "
           f"({d['graph_replays']} replays)" if d.get("gpu_ms_per_token") is not None else ""),
        f"             * {d['note']}",
        "",
        f"{'layer':>5} {'visits':>6} {'streamed B':>14} {'sets':>6} {'per-ubatch B':>14} {'upload s':>9} {'compute s':>9} "
        f"{'wait s':>9}",
    ]
    timing = {row["layer"]: row for row in t["per_layer"]}
    streamed = {row["layer"]: row for row in p["per_layer"]}
    for layer in sorted(set(timing) | set(streamed)):
        tr = timing.get(layer, {"copy_s": 0.0, "compute_s": 0.0, "wait_s": 0.0})
        row = streamed.get(layer)
        figures = (f"{row['visits']:>6} {row['bytes']:>14} {row['expert_sets']:>6.3f} "
                   f"{row['per_microbatch_would_bytes']:>14}" if row else f"{'dense':>6} {'-':>14} {'-':>6} {'-':>14}")
        lines.append(f"{layer:>5} {figures} {tr['copy_s']:>9.4f} {tr['compute_s']:>9.4f} {tr['wait_s']:>9.4f}")
    lines.append(f"{'total':>5} {sum(x['visits'] for x in p['per_layer']):>6} {p['stream_bytes']:>14} "
                 f"{p['expert_sets']:>6.3f} {p['per_microbatch_would_bytes']:>14} {t['copy_s']:>9.4f} "
                 f"{t['compute_s']:>9.4f} {t['upload_wait_s']:>9.4f}")
    return "\n".join(lines)
