"""The PNG charts of ``objq report`` (matplotlib, drawn without a display)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any


def draw_charts(out: Path, hourly: Any, tasks: Any) -> list[str]:
    """Draw throughput, latency and failure charts into ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")  # no display in a pipeline
    import matplotlib.pyplot as plt

    names: list[str] = []
    labels = hourly["queue"] + " " + hourly["task"] if len(hourly) else hourly["task"]

    figure, axis = plt.subplots(figsize=(9, 4))
    for label in sorted(set(labels)):
        rows = hourly[labels == label]
        axis.plot(rows["hour"], rows["jobs_per_second"], marker="o", label=label)
    axis.set_title("Throughput per hour")
    axis.set_ylabel("jobs finished per second")
    _hour_axis(axis, hourly)
    _finish(figure, axis, out / "throughput.png", bool(len(hourly)))
    names.append("throughput.png")

    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, metric, title in ((axes[0], "wait", "Queue wait"), (axes[1], "run", "Run time")):
        for label in sorted(set(labels)):
            rows = hourly[labels == label]
            for level, style in (("p50", "-"), ("p99", "--")):
                axis.plot(
                    rows["hour"],
                    rows[f"{metric}_{level}_s"],
                    style,
                    marker="o",
                    label=f"{label} {level}",
                )
        axis.set_title(f"{title} (p50 solid, p99 dashed)")
        axis.set_ylabel("seconds")
        _hour_axis(axis, hourly)
        _finish(None, axis, None, bool(len(hourly)))
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


def _hour_axis(axis: Any, hourly: Any) -> None:
    """UTC hours on the x axis, an hour of margin either side (one hour alone would otherwise
    be drawn on an axis of years)."""
    import matplotlib.dates as mdates

    axis.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d %H:%M"))  # type: ignore[no-untyped-call]
    if len(hourly):
        # A plain timedelta: pandas 2.3's Timedelta(hours=...) warns under numpy 2.5.
        margin = timedelta(hours=1)
        axis.set_xlim(hourly["hour"].min() - margin, hourly["hour"].max() + margin)


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
