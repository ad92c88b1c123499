"""``hotswap simulate``: compare recovery policies on a simulated cluster."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer


def simulate(
    nodes: int = typer.Option(4096, "--nodes", help="Nodes (hosts) in the cluster.", min=2),
    days: float = typer.Option(30.0, "--days", help="Simulated days.", min=0.001),
    seed: int = typer.Option(0, "--seed", help="Random seed: same seed, same failures and jobs."),
    device_type: str = typer.Option("v6e-16", "--device-type", "--tpu-type", help="Slice type (xpk name)."),
    failure_rate: float = typer.Option(
        6.5, "--failure-rate", help="Failures per 1000 node-days (Meta 2024: 6.5).", min=0.0
    ),
    repair_minutes: float = typer.Option(10.0, "--repair-minutes", help="Time to repair a node (GKE: ~10).", min=0.0),
    checkpoint_minutes: float = typer.Option(30.0, "--checkpoint-minutes", help="Periodic checkpoint interval.", min=0.1),
    policy: list[str] = typer.Option(
        [], "--policy", help="Policies to compare (repeatable): wait-for-repair, hotswap, hotswap+elastic. Default: all."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object on stdout."),
    plot: Path | None = typer.Option(None, "--plot", help="Write a comparison chart to this PNG file.", dir_okay=False),
) -> None:
    """Simulate failures on a cluster and compare wait-for-repair, hotswap and hotswap+elastic.

    A discrete-event simulation drives hotswap's own scheduling core: node failures drawn per
    node, a long very-high-priority job and lower-priority fillers; it reports goodput per
    priority, MTTR, preemptions and failures for each policy.
    """
    from hotswap.api.errors import InvalidInputError
    from hotswap.api.limits import check_number
    from hotswap.sim.config import POLICIES, SimConfig
    from hotswap.sim.runner import compare

    # Finite bounds (a NaN or an infinite number of days once ran forever).
    for flag, value, low, high in (
        ("--nodes", nodes, 2, 65_536), ("--days", days, 0.001, 3650), ("--failure-rate", failure_rate, 0, 100_000),
        ("--repair-minutes", repair_minutes, 0, 525_600), ("--checkpoint-minutes", checkpoint_minutes, 0.1, 525_600),
    ):
        check_number(flag, value, low, high)
    if plot is not None and plot.suffix.lower() != ".png":
        raise InvalidInputError(f"--plot {plot}: the chart is written as PNG; give a file name ending in .png")
    if plot is not None and not plot.parent.exists():
        raise InvalidInputError(f"--plot {plot}: directory {plot.parent} does not exist")
    config = SimConfig(
        nodes=nodes,
        days=days,
        seed=seed,
        device_type=device_type,
        failures_per_1000_node_days=failure_rate,
        repair_s=repair_minutes * 60.0,
        checkpoint_interval_s=checkpoint_minutes * 60.0,
        policies=tuple(policy) if policy else tuple(POLICIES),
    )
    comparison = _run_with_progress(config)
    summary = comparison.to_dict()
    if plot is not None:
        from hotswap.sim.plot import plot_comparison

        plot_comparison(comparison, plot)
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    _print_table(summary)
    if plot is not None:
        print(f"chart written to {plot}")


def _run_with_progress(config):
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from hotswap.sim.runner import compare

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description:<16}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}% of {task.fields[days]:g} days"),
        TimeElapsedColumn(),
        console=console,
        transient=not console.is_terminal,
        disable=not console.is_terminal,
    ) as progress:
        tasks = {name: progress.add_task(name, total=1.0, days=config.days) for name in config.policies}
        return compare(config, lambda name, fraction: progress.update(tasks[name], completed=fraction))


def _print_table(summary: dict) -> None:
    """Metrics down, policies across: fits a terminal of 80 columns."""
    from rich.console import Console
    from rich.table import Table

    levels = ["very-high", "high", "medium", "low", "very-low"]
    policies = summary["policies"]
    present = [lv for lv in levels if any(lv in p["goodput_by_priority"] for p in policies.values())]
    p = summary["params"]
    table = Table(
        title=(
            f"{summary['nodes']} nodes = {summary['slices']} x {summary['device_type']}, {summary['days']:g} days,"
            f" seed {summary['seed']}; {p['failures_per_1000_node_days']:g} failures/1000 node-days,"
            f" repair {p['repair_s'] / 60:g} min, checkpoint every {p['checkpoint_interval_s'] / 60:g} min"
        ),
        title_justify="left",
    )
    table.add_column("")
    for name in policies:
        table.add_column(name, justify="right")
    for level in present:
        table.add_row(
            f"goodput {level}",
            *(f"{r['goodput_by_priority'][level]:.3f}" if level in r["goodput_by_priority"] else "-" for r in policies.values()),
        )
    table.add_row("MTTR very-high p50/p99 (s)", *(_pair(r["mttr_by_priority_s"].get("very-high", {})) for r in policies.values()))
    table.add_row("MTTR all jobs p50/p99 (s)", *(_pair(r["mttr_s"]) for r in policies.values()))
    table.add_row("preemptions", *(str(r["preemptions"]) for r in policies.values()))
    table.add_row("node failures", *(str(r["failures"]) for r in policies.values()))
    table.add_row("failures under a job", *(str(r["disruptions"]) for r in policies.values()))
    table.add_row("jobs completed", *(str(r["completed_jobs"]) for r in policies.values()))
    Console().print(table)
    print(f"simulated in {summary['wall_s']:.1f} s")


def _pair(mttr: dict) -> str:
    if not mttr or mttr.get("p50") is None:
        return "-"
    return f"{mttr['p50']:g} / {mttr['p99']:g}"
