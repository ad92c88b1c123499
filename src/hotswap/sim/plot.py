"""The comparisons as pictures (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hotswap.sim.runner import LEVELS, Comparison
from hotswap.sim.sweep import Sweep

# One colour and marker per policy, the same in every chart.
STYLE = {
    "wait-for-repair": ("#c44e52", "s"),
    "hotswap": ("#4c72b0", "o"),
    "hotswap+elastic": ("#55a868", "^"),
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure: Any, path: str | Path) -> Path:
    target = Path(path)
    figure.savefig(target, dpi=110, bbox_inches="tight")
    _pyplot().close(figure)
    return target


def plot_sweep(result: Sweep, path: str | Path) -> Path:
    """Goodput against cluster size per policy, with 95% confidence intervals: of the
    high-priority job, and of the lower-priority work sharing the cluster."""
    plt = _pyplot()
    base = result.base
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharex=True)
    panels = (
        ("main_goodput", "High-priority job"),
        ("low_priority_goodput", "All other work (lower priorities)"),
    )
    # Policies side by side around each size, so that their error bars do not hide each other.
    offsets = {p: 2 ** (0.05 * (i - (len(base.policies) - 1) / 2)) for i, p in enumerate(base.policies)}
    for ax, (metric, title) in zip(axes, panels):
        for policy in base.policies:
            colour, marker = STYLE.get(policy, (None, "o"))
            points = [(n, result.estimates(policy, n).get(metric)) for n in result.sizes]
            xs = [n * offsets[policy] for n, e in points if e is not None]
            ys = [e.mean for _, e in points if e is not None]
            # A goodput lies in [0, 1]: with few seeds the interval is clipped there, not drawn past it.
            below = [min(e.ci95, e.mean) for _, e in points if e is not None]
            above = [min(e.ci95, 1.0 - e.mean) for _, e in points if e is not None]
            ax.errorbar(xs, ys, yerr=[below, above], label=policy, color=colour, marker=marker, capsize=4, linewidth=1.6)
        ax.set_xscale("log", base=2)
        ax.set_xticks(result.sizes, [f"{n:,}" for n in result.sizes])
        ax.minorticks_off()
        ax.set_xlabel("cluster size (nodes)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("goodput (productive share of slice-time)")
    axes[0].legend(loc="lower left", fontsize=9)
    seeds = len(result.seeds)
    figure.suptitle(
        f"{base.device_type} slices, {base.days:g} days, {base.failures_per_1000_node_days:g} failures/1000"
        f" node-days, repair {base.repair_s / 60:g} min; mean of {seeds} seed{'s' if seeds > 1 else ''}, 95% CI"
    )
    figure.tight_layout()
    return _save(figure, path)


def plot_comparison(comparison: Comparison, path: str | Path) -> Path:
    """One cluster: goodput by priority, the very-high job's recovery time, and its badput."""
    plt = _pyplot()
    summary = comparison.to_dict()
    policies = list(summary["policies"])
    figure, (goodput_ax, mttr_ax, badput_ax) = plt.subplots(
        1, 3, figsize=(17, 5.2), gridspec_kw={"width_ratios": [1.5, 1, 1]}
    )
    config = comparison.config
    figure.suptitle(
        f"{config.nodes:,} nodes ({config.slices:,} x {config.device_type}), {config.days:g} days,"
        f" {config.failures_per_1000_node_days:g} failures/1000 node-days, repair {config.repair_s / 60:g} min"
    )
    runs = summary["policies"]
    levels = [lv for lv in LEVELS if any(lv in p["goodput_by_priority"] for p in runs.values())]
    width = 0.8 / max(1, len(policies))
    for i, name in enumerate(policies):
        values = [runs[name]["goodput_by_priority"].get(lv, 0.0) for lv in levels]
        xs = [x + (i - (len(policies) - 1) / 2) * width for x in range(len(levels))]
        bars = goodput_ax.bar(xs, values, width, label=name, color=STYLE.get(name, (None,))[0])
        goodput_ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=7, padding=1)
    goodput_ax.set_xticks(range(len(levels)), levels)
    goodput_ax.set_ylim(0, 1.18)
    goodput_ax.set_ylabel("goodput (productive share of slice-time)")
    goodput_ax.set_title("Goodput by priority")
    goodput_ax.legend(fontsize=8, loc="upper center", ncol=len(policies))

    main_mttr = [runs[n]["mttr_by_priority_s"].get("very-high", {}) for n in policies]
    p50 = [m.get("p50") or 0.0 for m in main_mttr]
    p99 = [m.get("p99") or 0.0 for m in main_mttr]
    xs = list(range(len(policies)))
    mttr_ax.bar([x - 0.2 for x in xs], p50, 0.4, label="p50")
    mttr_ax.bar([x + 0.2 for x in xs], p99, 0.4, label="p99")
    mttr_ax.set_xticks(xs, policies, fontsize=8)
    mttr_ax.set_title("Recovery time of the very-high job")
    if any(v > 0 for v in p50 + p99):
        mttr_ax.set_yscale("log")
        mttr_ax.set_ylabel("seconds (log)")
        mttr_ax.legend(fontsize=8)
    else:  # a log axis of nothing but zeros is matplotlib's warning on the user's terminal
        mttr_ax.set_yticks([])
        mttr_ax.text(0.5, 0.5, "no recovery of the very-high job in this run", transform=mttr_ax.transAxes, ha="center", va="center", fontsize=9)

    bottoms = [0.0] * len(policies)
    for category in ("wasted_progress", "recovery", "startup", "checkpoint_restore", "checkpoint_save", "elastic", "degraded"):
        values = [100.0 * runs[n]["badput_by_priority"].get("very-high", {}).get(category, 0.0) for n in policies]
        if any(v > 0 for v in values):
            badput_ax.bar(xs, values, 0.6, bottom=bottoms, label=category.replace("_", " "))
            bottoms = [b + v for b, v in zip(bottoms, values)]
    badput_ax.set_xticks(xs, policies, fontsize=8)
    badput_ax.set_ylabel("% of the job's slice-time")
    badput_ax.set_title("Badput of the very-high job")
    badput_ax.legend(fontsize=8)
    figure.tight_layout()
    return _save(figure, path)
