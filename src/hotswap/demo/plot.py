"""A drill as a picture: which job held each slice over time (failures and repairs marked),
and each job's training step over time (matplotlib, imported only here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_HOLD = {"admit", "restart", "startworkers", "scaleup", "scaledown"}
_RELEASE = {"preempt", "requeue", "fail", "complete", "remove"}


def slice_segments(timeline: list[dict[str, Any]], end: float) -> dict[str, list[tuple[float, float, str]]]:
    """slice -> [(start, stop, workload)] from the controller's timeline."""
    holding: dict[str, tuple[str, float]] = {}  # slice -> (workload, since)
    segments: dict[str, list[tuple[float, float, str]]] = {}

    def release(slice_: str, t: float) -> None:
        if slice_ in holding:
            workload, since = holding.pop(slice_)
            segments.setdefault(slice_, []).append((since, t, workload))

    for row in timeline:
        kind, workload, t = row["kind"], row.get("workload"), float(row["t"])
        data = json.loads(row["data"]) if row.get("data") else {}
        if kind in _HOLD and "slices" in data:
            held = set(data["slices"])
            for slice_, (owner, _) in list(holding.items()):
                if owner == workload and slice_ not in held:
                    release(slice_, t)
            for slice_ in data["slices"]:
                if holding.get(slice_, (None, 0.0))[0] != workload:
                    release(slice_, t)
                    holding[slice_] = (workload, t)
        elif kind in _RELEASE and workload:
            for slice_, (owner, _) in list(holding.items()):
                if owner == workload:
                    release(slice_, t)
    for slice_ in list(holding):
        release(slice_, end)
    return segments


def plot_drill(summary: dict[str, Any], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = summary.get("timeline", [])
    start = min([float(r["t"]) for r in timeline] or [0.0])
    end = max([float(r["t"]) for r in timeline] + [m["t"] for m in summary.get("marks", [])] or [start + 1.0])
    progress = summary.get("progress", {})
    for points in progress.values():
        if points:
            end = max(end, points[-1][0])
    segments = slice_segments(timeline, end)
    jobs = sorted({w for segs in segments.values() for _, _, w in segs} | set(progress))
    colors = {job: plt.get_cmap("tab10")(i % 10) for i, job in enumerate(jobs)}

    figure, (slices_ax, steps_ax) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, gridspec_kw={"height_ratios": [1, 1.3]})
    names = sorted(segments, key=lambda s: int(s.rsplit("-", 1)[-1]) if s.rsplit("-", 1)[-1].isdigit() else 0)
    for row, slice_ in enumerate(names):
        for since, stop, workload in segments[slice_]:
            slices_ax.broken_barh([(since - start, max(stop - since, 0.05))], (row - 0.35, 0.7), color=colors.get(workload, "grey"))
    slices_ax.set_yticks(range(len(names)), names)
    slices_ax.set_title(f"hotswap demo {summary.get('scenario', '')}: slices held by each job")
    for job in jobs:
        slices_ax.plot([], [], color=colors[job], linewidth=8, label=job)
    slices_ax.legend(loc="upper right", fontsize=8)

    for job, points in progress.items():
        if points:
            steps_ax.plot([t - start for t, _ in points], [s for _, s in points], ".", markersize=2, color=colors[job], label=job)
    steps_ax.set_ylabel("training step")
    steps_ax.set_xlabel("seconds")
    steps_ax.legend(loc="upper left", fontsize=8)
    for mark in summary.get("marks", []):
        colour = "red" if mark["what"] == "fail" else "green"
        for ax in (slices_ax, steps_ax):
            ax.axvline(mark["t"] - start, color=colour, linestyle="--", linewidth=1)
        slices_ax.text(mark["t"] - start, 0.98, f"{'failure' if mark['what'] == 'fail' else 'repair'} {mark['node']} ",
                       transform=slices_ax.get_xaxis_transform(), fontsize=7, color=colour, rotation=90, va="top", ha="right")
    figure.tight_layout()
    target = Path(path)
    figure.savefig(target, dpi=110)
    plt.close(figure)
    return target
