"""`runner profile --plot`: the copy and compute streams per layer on one time axis (matplotlib, optional)."""

from __future__ import annotations

import json
from typing import Any

from runner.errors import RunnerError

INSTALL_HINT = "--plot needs matplotlib: pip install 'moe-offload-runner[plot]'"


def require_matplotlib() -> None:
    """Fail before any work when --plot cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise RunnerError(INSTALL_HINT) from None


def plot_timeline(report: dict[str, Any], path: str) -> None:
    """One row per layer, its copy spans above its compute spans; the key figures in the title and the
    PNG's Description metadata (JSON), so the picture can be checked against the table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans = report["timeline"]
    layers = sorted({s["layer"] for s in spans})
    row = {layer: i for i, layer in enumerate(layers)}
    fig, ax = plt.subplots(figsize=(12, max(3.0, 0.35 * len(layers) + 1.5)))
    colors = {"copy": "tab:orange", "compute": "tab:blue", "wait": "lightgrey"}
    # The y axis is inverted: copy draws above; a compute span's waits for uploads draw over it.
    for stream, offset in (("copy", -0.4), ("compute", 0.05), ("wait", 0.05)):
        labelled = False
        for layer in layers:
            bars = [(s["start_s"] * 1e3, (s["end_s"] - s["start_s"]) * 1e3) for s in spans
                    if s["stream"] == stream and s["layer"] == layer]
            if bars:
                ax.broken_barh(bars, (row[layer] + offset, 0.35), color=colors[stream],
                               label=None if labelled else stream)
                labelled = True
    ax.set_yticks(range(len(layers)), [str(layer) for layer in layers])
    ax.set_ylabel("layer")
    ax.set_xlabel(f"milliseconds ({report['timing']['clock']})")
    ax.invert_yaxis()
    p, t = report["prefill"], report["timing"]
    ax.set_title(f"{report['prompt']['new_tokens']} prompt tokens, TTFT {report['ttft_s'] * 1e3:.1f} ms; "
                 f"{p['stream_bytes']} B streamed = {p['expert_sets']:.3f} expert sets ({p['order']}); "
                 f"upload {t['copy_s'] * 1e3:.1f} ms, compute {t['compute_s'] * 1e3:.1f} ms "
                 f"({t['compute_busy_s'] * 1e3:.1f} not waiting for uploads), "
                 f"overlap {t['overlap_s'] * 1e3:.1f} ms", fontsize=9)
    ax.legend(loc="upper right")
    fig.tight_layout()
    key = {"ttft_s": report["ttft_s"], "stream_bytes": p["stream_bytes"], "expert_sets": p["expert_sets"],
           "copy_s": t["copy_s"], "compute_s": t["compute_s"], "overlap_s": t["overlap_s"], "spans": len(spans)}
    fig.savefig(path, dpi=110, metadata={"Description": json.dumps(key)})
    plt.close(fig)
