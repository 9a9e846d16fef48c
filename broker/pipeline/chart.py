"""The report's picture: throughput and latency over time, and how often messages were
delivered. Drawn with matplotlib from the small aggregated frame, never from raw rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display needed

import matplotlib.pyplot as plt  # noqa: E402


def draw(series: Any, summary: dict[str, Any], bucket_ms: int, path: Path) -> None:
    """`series`: a pandas frame of `over_time` rows (queue, time, enqueued, acked, removed,
    latency_p50_ms, latency_p99_ms)."""
    fig, (rate_ax, lat_ax, hist_ax) = plt.subplots(3, 1, figsize=(11, 11),
                                                   gridspec_kw={"height_ratios": [3, 3, 2]})
    per_s = 1000.0 / bucket_ms
    unit = {3_600_000: "hour", 60_000: "minute", 1_000: "second"}.get(
        bucket_ms, f"{bucket_ms / 1000:g} s")
    for queue, found in series.groupby("queue"):
        rows = _every_bucket(found, bucket_ms)
        line, = rate_ax.plot(rows["time"], rows["enqueued"] * per_s, label=f"{queue} enqueued")
        rate_ax.plot(rows["time"], rows["acked"] * per_s, linestyle="--", color=line.get_color(),
                     label=f"{queue} acked")
        if rows["removed"].any():
            rate_ax.plot(rows["time"], rows["removed"] * per_s, linestyle=":",
                         color=line.get_color(), label=f"{queue} removed")
        acked = rows[rows["latency_p50_ms"].notna()]
        lat_ax.plot(acked["time"], acked["latency_p50_ms"], color=line.get_color(),
                    marker="o", markersize=3, label=f"{queue} p50")
        lat_ax.plot(acked["time"], acked["latency_p99_ms"], color=line.get_color(),
                    marker="o", markersize=3, linestyle="--", label=f"{queue} p99")
    rate_ax.set_title(f"Throughput (messages per second, per {unit})")
    rate_ax.set_ylabel("msgs/s")
    lat_ax.set_title("Enqueue to ack latency")
    lat_ax.set_ylabel("ms")
    lat_ax.set_yscale("symlog", linthresh=10)
    for ax in (rate_ax, lat_ax):
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8, loc="upper left")
    _histogram(hist_ax, summary)
    fig.suptitle(f"kq journal report: {summary['records']:,} transitions, "
                 f"{len(summary['queues'])} queue(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _every_bucket(rows: Any, bucket_ms: int) -> Any:
    """The queue's rows with a zero row for every empty bucket between its first and last,
    so a quiet spell shows as quiet instead of a line drawn across it."""
    import pandas as pd

    rows = rows.set_index("at_ms").sort_index()
    full = range(int(rows.index.min()), int(rows.index.max()) + bucket_ms, bucket_ms)
    rows = rows.reindex(full)
    for col in ("enqueued", "acked", "removed"):
        rows[col] = rows[col].fillna(0)
    rows["time"] = pd.to_datetime(rows.index, unit="ms")
    return rows


def _histogram(ax: Any, summary: dict[str, Any]) -> None:
    queues = summary["queues"]
    counts = sorted({int(k) for q in queues.values() for k in q["deliveries_histogram"]})
    width = 0.8 / max(1, len(queues))
    for i, (name, q) in enumerate(sorted(queues.items())):
        hist = q["deliveries_histogram"]
        ax.bar([c + i * width for c in counts], [hist.get(str(c), 0) for c in counts],
               width=width, label=name)
    ax.set_title("Deliveries per message")
    ax.set_xlabel("times delivered")
    ax.set_ylabel("messages")
    ax.set_xticks([c + 0.4 - width / 2 for c in counts], [str(c) for c in counts])
    ax.set_yscale("log")
    ax.grid(alpha=0.3, axis="y")
    if queues:
        ax.legend(fontsize=8)
