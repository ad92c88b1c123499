"""A drill as a picture: which job held each slice over time (with the time each slice was out
of service), and each job's every training step over time, on how many slices; failures,
repairs, deletions and creations as numbered lines explained in a legend, so no two labels
overlap (matplotlib, imported only here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_HOLD = {"admit", "restart", "startworkers", "scaleup", "scaledown"}
_RELEASE = {"preempt", "requeue", "fail", "complete", "remove"}
_OUT = {"node-failed", "node-cordoned", "node-drained"}
_BACK = {"node-repaired", "node-uncordoned"}
# How each kind of mark is drawn and named.
MARK_STYLES = {
    "fail": ("red", "node failed"),
    "drain": ("darkorange", "node drained"),
    "cordon": ("grey", "node cordoned"),
    "uncordon": ("green", "node repaired"),
    "delete": ("darkorange", "deleted (SIGTERM: checkpoint)"),
    "create": ("purple", "created again"),
    "submit": ("purple", "submitted"),
    "complete": ("teal", "completed"),
}
OUTAGE_LABEL = "slice out of service"


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
        data = _data(row)
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


def slice_outages(timeline: list[dict[str, Any]], slices: set[str], end: float) -> dict[str, list[tuple[float, float]]]:
    """slice -> [(start, stop)] while one of its nodes was failed, cordoned or drained."""
    down: dict[str, float] = {}  # node -> since
    outages: dict[str, list[tuple[float, float]]] = {}
    for row in timeline:
        node = _data(row).get("node")
        if not node:
            continue
        t = float(row["t"])
        if row["kind"] in _OUT:
            down.setdefault(node, t)
        elif row["kind"] in _BACK and node in down:
            outages.setdefault(_slice_of(node, slices), []).append((down.pop(node), t))
    for node, since in down.items():
        outages.setdefault(_slice_of(node, slices), []).append((since, end))
    return outages


def _slice_of(node: str, slices: set[str]) -> str:
    """A node's slice: its name without the host index (``c-np-1-0`` -> ``c-np-1``)."""
    base = node.rsplit("-", 1)[0]
    return base if base in slices or not slices else next((s for s in slices if node.startswith(s + "-")), base)


def _data(row: dict[str, Any]) -> dict[str, Any]:
    data = row.get("data")
    if isinstance(data, str) and data:
        return json.loads(data)
    return data if isinstance(data, dict) else {}


def draw_drill(summary: dict[str, Any]) -> Any:
    """The drill's figure (a matplotlib ``Figure``; nothing is written)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    timeline = summary.get("timeline", [])
    marks = summary.get("marks", [])
    progress = summary.get("progress", {})
    times = [float(r["t"]) for r in timeline] + [m["t"] for m in marks] + [p[0] for ps in progress.values() for p in ps]
    # The live log's origin, the command's start, when the summary says it; else the first record.
    start = summary.get("started_t") or min(times or [0.0])
    end = max(times or [start + 1.0])
    segments = slice_segments(timeline, end)
    names = sorted(set(segments) | {s for r in timeline if r["kind"] == "slice-added" for s in [_slice_name(r)] if s}, key=_ordinal)
    outages = slice_outages(timeline, set(names), end)
    names = sorted(set(names) | set(outages), key=_ordinal)
    jobs = sorted({w for segs in segments.values() for _, _, w in segs} | set(progress))
    colors = {job: plt.get_cmap("tab10")(i % 10) for i, job in enumerate(jobs)}
    prefix = f"{summary['cluster']}-" if summary.get("cluster") else _common_prefix(names)

    figure, (slices_ax, steps_ax) = plt.subplots(
        2, 1, figsize=(11, 7.5), sharex=True, gridspec_kw={"height_ratios": [1, 1.4]}
    )
    for row, slice_ in enumerate(names):
        for since, stop, workload in segments.get(slice_, []):
            slices_ax.broken_barh([(since - start, max(stop - since, 0.05))], (row - 0.3, 0.6), color=colors.get(workload, "grey"))
        for since, stop in outages.get(slice_, []):
            slices_ax.broken_barh([(since - start, max(stop - since, 0.05))], (row - 0.45, 0.9), facecolor="none",
                                  edgecolor="red", hatch="///", linewidth=1.0, label=OUTAGE_LABEL)
    slices_ax.set_yticks(range(len(names)), [n[len(prefix):] or n for n in names])
    slices_ax.set_ylim(-0.6, max(len(names), 1) - 0.4)
    slices_ax.set_title(f"hotswap demo {summary.get('scenario', '')}: slices of {prefix.rstrip('-') or 'the cluster'} held by each job")
    handles: list[Any] = [Patch(color=colors[job], label=job) for job in jobs]
    if outages:
        handles.append(Patch(facecolor="none", edgecolor="red", hatch="///", label=OUTAGE_LABEL))
    slices_ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)

    for job, raw in progress.items():
        points = _with_breaks(raw)
        counts = sorted({p[2] for p in points if len(p) > 2 and p[2] is not None})
        if len(counts) <= 1:
            suffix = f" ({counts[0]} slice(s))" if counts else ""
            steps_ax.plot([p[0] - start for p in points], [p[1] for p in points], ".-", markersize=3, linewidth=0.8,
                          color=colors[job], label=f"{job}{suffix}")
            continue
        steps_ax.plot([p[0] - start for p in points], [p[1] for p in points], "-", linewidth=0.6, color=colors[job], alpha=0.5)
        for count, marker, shade in zip(counts, "o^sDv", _shades(colors[job], len(counts))):
            mine = [p for p in raw if len(p) > 2 and p[2] == count]
            steps_ax.plot([p[0] - start for p in mine], [p[1] for p in mine], marker, linestyle="none", markersize=3,
                          color=shade, label=f"{job} on {count} slice(s)")
    steps_ax.set_ylabel("training step (rank 0)")
    steps_ax.set_xlabel("seconds since the command started" if summary.get("started_t") else "seconds")

    mark_handles = []
    for number, mark in enumerate(sorted(marks, key=lambda m: m["t"]), start=1):
        colour, words = MARK_STYLES.get(mark["what"], ("black", mark["what"]))
        x = mark["t"] - start
        for ax in (slices_ax, steps_ax):
            ax.axvline(x, color=colour, linestyle="--", linewidth=1)
        # The number alone sits on the line (staggered in height); the words go in the legend.
        steps_ax.annotate(str(number), (x, 1.0 - 0.07 * ((number - 1) % 3)), xycoords=("data", "axes fraction"),
                          fontsize=8, color=colour, ha="center", va="top",
                          bbox={"boxstyle": "circle,pad=0.2", "fc": "white", "ec": colour})
        what = mark.get("node") or mark.get("workload") or ""
        mark_handles.append(Line2D([], [], color=colour, linestyle="--", label=f"{number}. {words}: {what} at {x:.1f} s"))
    series = steps_ax.get_legend_handles_labels()[0]
    steps_ax.legend(handles=[*series, *mark_handles], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    figure.tight_layout()
    return figure


def plot_drill(summary: dict[str, Any], path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    figure = draw_drill(summary)
    target = Path(path)
    figure.savefig(target, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return target


def _shades(colour: Any, count: int) -> list[tuple[float, float, float]]:
    """``count`` colours told apart at a glance, the job's own among them: from a dark to a
    light shade of it (fewest slices darkest), so every slice count has a colour of its own."""
    from matplotlib.colors import to_rgb

    base = to_rgb(colour)
    if count <= 1:
        return [base]
    shades = []
    for i in range(count):
        mix = -0.45 + 0.9 * i / (count - 1)  # < 0: towards black, > 0: towards white
        shades.append(tuple(c * (1 + mix) if mix < 0 else c + (1 - c) * mix for c in base))
    return shades  # type: ignore[return-value]


def _with_breaks(points: list[Any]) -> list[Any]:
    """The points with a gap (NaN) wherever training stopped for much longer than a step, so a
    line never bridges an outage as if training went on."""
    gaps = sorted(b[0] - a[0] for a, b in zip(points, points[1:]))
    if not gaps:
        return list(points)
    limit = max(10 * gaps[len(gaps) // 2], 0.5)
    broken: list[Any] = [points[0]]
    for before, after in zip(points, points[1:]):
        if after[0] - before[0] > limit:
            broken.append((before[0], float("nan"), None))
        broken.append(after)
    return broken


def _slice_name(row: dict[str, Any]) -> str | None:
    message = str(row.get("message") or "")
    return message.split()[1] if message.startswith("slice ") and len(message.split()) > 1 else None


def _ordinal(name: str) -> tuple[str, int]:
    base, _, last = name.rpartition("-")
    return (base, int(last)) if last.isdigit() else (name, 0)


def _common_prefix(names: list[str]) -> str:
    """What every slice name starts with, up to a dash (the cluster's name): left out of the
    tick labels and said once in the title."""
    if len(names) < 2:
        return names[0].rsplit("-", 1)[0] + "-" if names and "-" in names[0] else ""
    first, last = min(names), max(names)
    size = 0
    while size < min(len(first), len(last)) and first[size] == last[size]:
        size += 1
    return first[: first.rfind("-", 0, size) + 1]
