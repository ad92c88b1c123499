"""The comparison as a picture (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

from pathlib import Path

from hotswap.sim.runner import Comparison

LEVELS = ["very-high", "high", "medium", "low", "very-low"]


def plot_comparison(comparison: Comparison, path: str | Path) -> Path:
    """Goodput by priority, MTTR of the very-high job, and where its badput went."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = comparison.to_dict()
    policies = list(summary["policies"])
    figure, (goodput_ax, mttr_ax, badput_ax) = plt.subplots(
        1, 3, figsize=(17, 5.2), gridspec_kw={"width_ratios": [1.5, 1, 1]}
    )
    config = comparison.config
    figure.suptitle(
        f"{config.nodes} nodes ({config.slices} x {config.device_type}), {config.days:g} days,"
        f" {config.failures_per_1000_node_days:g} failures/1000 node-days, repair {config.repair_s / 60:g} min"
    )

    levels = [lv for lv in LEVELS if any(lv in p["goodput_by_priority"] for p in summary["policies"].values())]
    width = 0.8 / max(1, len(policies))
    for i, name in enumerate(policies):
        values = [summary["policies"][name]["goodput_by_priority"].get(lv, 0.0) for lv in levels]
        xs = [x + (i - (len(policies) - 1) / 2) * width for x in range(len(levels))]
        bars = goodput_ax.bar(xs, values, width, label=name)
        goodput_ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=7, padding=1)
    goodput_ax.set_xticks(range(len(levels)), levels)
    goodput_ax.set_ylim(0, 1.18)
    goodput_ax.set_ylabel("goodput (productive share of slice-time)")
    goodput_ax.set_title("Goodput by priority")
    goodput_ax.legend(fontsize=8, loc="upper center", ncol=len(policies))

    main_mttr = [summary["policies"][n]["mttr_by_priority_s"].get("very-high", {}) for n in policies]
    p50 = [m.get("p50") or 0.0 for m in main_mttr]
    p99 = [m.get("p99") or 0.0 for m in main_mttr]
    xs = range(len(policies))
    mttr_ax.bar([x - 0.2 for x in xs], p50, 0.4, label="p50")
    mttr_ax.bar([x + 0.2 for x in xs], p99, 0.4, label="p99")
    mttr_ax.set_xticks(list(xs), policies, fontsize=8)
    mttr_ax.set_yscale("log")
    mttr_ax.set_ylabel("seconds (log)")
    mttr_ax.set_title("MTTR of the very-high job")
    mttr_ax.legend(fontsize=8)

    # Where the very-high job's slice-time went besides productive work.
    bottoms = [0.0] * len(policies)
    for category in ("wasted_progress", "recovery", "startup", "checkpoint_restore", "checkpoint_save", "elastic", "degraded"):
        values = [
            100.0 * summary["policies"][n]["badput_by_priority"].get("very-high", {}).get(category, 0.0)
            for n in policies
        ]
        if any(v > 0 for v in values):
            badput_ax.bar(list(xs), values, 0.6, bottom=bottoms, label=category.replace("_", " "))
            bottoms = [b + v for b, v in zip(bottoms, values)]
    badput_ax.set_xticks(list(xs), policies, fontsize=8)
    badput_ax.set_ylabel("% of the job's slice-time")
    badput_ax.set_title("Badput of the very-high job")
    badput_ax.legend(fontsize=8)

    figure.tight_layout()
    target = Path(path)
    figure.savefig(target, dpi=110)
    plt.close(figure)
    return target
