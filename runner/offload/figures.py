"""Per-request expert offload figures: what the engine's offload counters moved during one generation.

`engine.stats()` holds totals since load; a request's share is the difference of two snapshots.
`counted_steps` takes them around a generation and leaves the figures on `gen.offload`, where
`Generation.timings()` (and so the CLI, the chat summary and the server's timings) find them.
"""

from __future__ import annotations

from typing import Any, Iterator

from runner.engine.generation import Generation, Step


def request_figures(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """Flat figures between two `engine.stats()` snapshots; None when every expert is resident."""
    if not after:
        return None
    c0, c1 = before["cache"]["total"], after["cache"]["total"]
    p0, p1 = before["prefill"]["total"], after["prefill"]["total"]
    f0, f1 = before["phase"], after["phase"]
    hits, misses = c1["hits"] - c0["hits"], c1["misses"] - c0["misses"]
    miss_bytes, warm_bytes = c1["bytes_uploaded"] - c0["bytes_uploaded"], c1["warm_bytes"] - c0["warm_bytes"]
    warm_device_bytes = c1["warm_device_bytes"] - c0["warm_device_bytes"]  # staging to slots, no PCIe
    prefill_bytes = p1["bytes"] - p0["bytes"]
    set_bytes = after["prefill"]["expert_set_bytes"]
    begins = f1["begins"] - f0["begins"]
    last = f1["last"] if begins and f1["ends"] > f0["ends"] else None
    return {
        "cache_hits": hits,
        "cache_misses": misses,
        "cache_hit_rate": hits / (hits + misses) if hits + misses else None,
        "cache_miss_bytes": miss_bytes,
        "warm_bytes": warm_bytes,
        "warm_device_bytes": warm_device_bytes,
        "prefill_bytes": prefill_bytes,
        "prefill_expert_sets": prefill_bytes / set_bytes if set_bytes else 0.0,
        "bytes_uploaded": miss_bytes + warm_bytes + prefill_bytes,
        "phase_begins": begins,
        "phase_ends": f1["ends"] - f0["ends"],
        "phase_failures": f1["failures"] - f0["failures"],
        "phase_skipped": f1["skipped"] - f0["skipped"],
        "phase_release_s": last["release_s"] if last else None,
        "phase_restore_s": last["restore_s"] if last else None,
    }


def counted_steps(engine: Any, gen: Generation) -> Iterator[Step]:
    """`gen.steps()`, then `gen.offload` set to the offload figures of this generation (closed early too)."""
    before = engine.stats()
    try:
        yield from gen.steps()
    finally:
        gen.offload = request_figures(before, engine.stats())


def describe_totals(stats: dict[str, Any]) -> list[str]:
    """Lines for a human: the engine's offload totals since load (chat's /stats)."""
    if not stats:
        return ["expert offload: off (every expert resident)"]
    c, cache = stats["cache"]["total"], stats["cache"]
    p, phase = stats["prefill"]["total"], stats["phase"]
    lookups = c["hits"] + c["misses"]
    rate = f"{c['hits'] / lookups:.0%}" if lookups else "-"
    last = phase["last"]
    timing = (f"; last release {last['release_s']:.4f} s, restore {last['restore_s']:.4f} s" if last else "")
    return [
        f"expert offload: {cache['slots_per_layer']} slots per MoE layer ({cache['policy']}), "
        f"{_mib(cache['bytes'])} of slots, host store {'pinned' if stats['host_store']['pinned'] else 'pageable'}",
        f"expert cache: {c['hits']} hits, {c['misses']} misses ({rate} hit rate; random-weight models have no real "
        f"routing locality), {_mib(c['bytes_uploaded'])} uploaded on misses, {_mib(c['warm_bytes'])} warm refills",
        f"prefill streaming ({stats['prefill']['order']}): {_mib(p['bytes'])} = {p['expert_sets']:.2f} expert sets; "
        f"phase transactions {phase['begins']} begun, {phase['ends']} ended, {phase['failures']} failed, "
        f"{phase['skipped']} skipped{timing}",
    ]


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
