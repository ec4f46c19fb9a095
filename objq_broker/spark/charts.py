"""The PNG charts of ``objq report`` (matplotlib, drawn without a display)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any


def draw_charts(out: Path, buckets: Any, tasks: Any, size: str) -> list[str]:
    """Draw throughput, latency and failure charts into ``out`` from the per-bucket table
    (buckets of ``size``, as the titles say); returns their file names."""
    import matplotlib

    matplotlib.use("Agg")  # no display in a pipeline
    import matplotlib.pyplot as plt

    names: list[str] = []
    labels = buckets["queue"] + " " + buckets["task"] if len(buckets) else buckets["task"]

    figure, axis = plt.subplots(figsize=(9, 4))
    for label in sorted(set(labels)):
        rows = buckets[labels == label]
        axis.plot(rows["bucket"], rows["jobs_per_second"], marker="o", label=label)
    axis.set_title(f"Throughput per {size} bucket")
    axis.set_ylabel("jobs finished per second")
    _time_axis(axis, buckets)
    _finish(figure, axis, out / "throughput.png", bool(len(buckets)))
    names.append("throughput.png")

    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, metric, title in ((axes[0], "wait", "Queue wait"), (axes[1], "run", "Run time")):
        for label in sorted(set(labels)):
            rows = buckets[labels == label]
            for level, style in (("p50", "-"), ("p99", "--")):
                axis.plot(
                    rows["bucket"],
                    rows[f"{metric}_{level}_s"],
                    style,
                    marker="o",
                    label=f"{label} {level}",
                )
        axis.set_title(f"{title} per {size} bucket (p50 solid, p99 dashed)")
        axis.set_ylabel("seconds")
        _time_axis(axis, buckets)
        _finish(None, axis, None, bool(len(buckets)))
    figure.autofmt_xdate()
    figure.tight_layout()
    figure.savefig(out / "latency.png", dpi=100)
    plt.close(figure)
    names.append("latency.png")

    figure, axis = plt.subplots(figsize=(9, 4))
    task_labels = list(tasks["queue"] + " " + tasks["task"]) if len(tasks) else []
    axis.bar(task_labels, list(tasks["failure_rate"] * 100) if len(tasks) else [])
    axis.set_title("Failure rate per task (failed or dead-lettered jobs)")
    axis.set_ylabel("% of finished jobs")
    figure.tight_layout()
    figure.savefig(out / "failures.png", dpi=100)
    plt.close(figure)
    names.append("failures.png")
    return names


def _time_axis(axis: Any, buckets: Any) -> None:
    """UTC times on the x axis (to the second when buckets are shorter than a minute), a
    bucket of margin either side (one bucket alone would otherwise be drawn on an axis of
    years)."""
    import matplotlib.dates as mdates

    seconds = int(buckets["bucket_seconds"].iloc[0]) if len(buckets) else 3600
    shown = "%Y-%m-%d %H:%M:%S" if seconds < 60 else "%Y-%m-%d %H:%M"
    axis.xaxis.set_major_formatter(mdates.DateFormatter(shown))  # type: ignore[no-untyped-call]
    if len(buckets):
        # A plain timedelta: pandas 2.3's Timedelta(seconds=...) warns under numpy 2.5.
        margin = timedelta(seconds=seconds)
        axis.set_xlim(buckets["bucket"].min() - margin, buckets["bucket"].max() + margin)


def _finish(figure: Any, axis: Any, path: Path | None, has_data: bool) -> None:
    if has_data:
        axis.legend(fontsize="small")
    else:
        axis.text(0.5, 0.5, "no jobs in range", ha="center", va="center", transform=axis.transAxes)
    if figure is not None and path is not None:
        import matplotlib.pyplot as plt

        figure.autofmt_xdate()
        figure.tight_layout()
        figure.savefig(path, dpi=100)
        plt.close(figure)
