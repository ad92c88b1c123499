"""``hotswap simulate``: compare recovery policies on a simulated cluster.

Numbers are checked by :class:`hotswap.sim.config.SimConfig` (one line per mistake, nothing
rounded); the options here only carry them. The simulator and matplotlib are imported inside
the command, so ``hotswap --help`` does not pay for them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from hotswap.cli.started import seconds_since_start

if TYPE_CHECKING:
    from hotswap.sim.config import SimConfig
    from hotswap.sim.sweep import Sweep

_POLICY_HELP = "Policies to compare (repeatable): wait-for-repair, hotswap, hotswap+elastic. Default: all."


def simulate(
    nodes: int = typer.Option(4096, "--nodes", help="Nodes (hosts) in the cluster; whole slices only."),
    days: float = typer.Option(30.0, "--days", help="Simulated days."),
    seed: int = typer.Option(0, "--seed", help="Random seed: same seed, same failures and jobs."),
    device_type: str = typer.Option("v6e-16", "--device-type", "--tpu-type", help="Slice type (xpk name)."),
    profile: str | None = typer.Option(
        None, "--profile", help="Published failure rate: meta-rsc1 (6.50/1000 node-days, the default),"
        " meta-rsc2 (2.34), llama3 (3.79)."
    ),
    failure_rate: float | None = typer.Option(None, "--failure-rate", help="Failures per 1000 node-days."),
    repair_minutes: float = typer.Option(10.0, "--repair-minutes", help="Time to repair a node (GKE: ~10)."),
    checkpoint_minutes: float = typer.Option(30.0, "--checkpoint-minutes", help="Periodic checkpoint interval."),
    elastic_snapshot_minutes: float = typer.Option(
        1.0, "--elastic-snapshot-minutes",
        help="Interval of the in-memory snapshots elastic jobs fall back to when they lose a slice.",
    ),
    policy: list[str] = typer.Option([], "--policy", help=_POLICY_HELP),
    compare: bool = typer.Option(
        False, "--compare", help="Run the policies over several cluster sizes and seeds; report means with 95% CIs."
    ),
    sizes: str | None = typer.Option(
        None, "--sizes", help="With --compare: cluster sizes in nodes, comma-separated (default: --nodes and 3 halvings)."
    ),
    seeds: int | None = typer.Option(None, "--seeds", help="With --compare: seeds per size, from --seed on (default 5)."),
    jobs: int | None = typer.Option(
        None, "--jobs", "-j", help="Worker processes (default: one per run when runs <= 2x CPUs, else one per CPU)."
    ),
    compare_victims: bool = typer.Option(
        False, "--compare-victims",
        help="Run one policy (default hotswap) twice on the same failures and jobs: victims chosen by least lost"
        " work (hotswap) and newest first (Kueue), victims losing the work since their last checkpoint.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object on stdout."),
    plot: Path | None = typer.Option(None, "--plot", help="Write a chart to this PNG file.", dir_okay=False),
) -> None:
    """Simulate failures on a cluster and compare wait-for-repair, hotswap and hotswap+elastic.

    A discrete-event simulation drives hotswap's own scheduling core: node failures drawn per
    node at a published rate, a long very-high-priority job and lower-priority fillers. Alone,
    one cluster and seed: goodput per priority, recovery times, preemptions. With the option
    --compare, every policy on the same failures over several sizes and seeds: the
    high-priority job's and the other work's goodput with confidence intervals, and a plot of
    goodput against cluster size.
    """
    from hotswap.api.errors import InvalidInputError
    from hotswap.sim.config import DEFAULT_PROFILE, POLICIES, SimConfig
    from hotswap.sim.config import profile as find_profile

    # Every number is bounded and finite in SimConfig (a NaN or an infinite number of days once
    # ran forever); the flags below are checked here because SimConfig does not see them.
    if plot is not None and plot.suffix.lower() != ".png":
        raise InvalidInputError(f"--plot {plot}: the chart is written as PNG; give a file name ending in .png")
    if plot is not None and not plot.parent.exists():
        raise InvalidInputError(f"--plot {plot}: directory {plot.parent} does not exist")
    if profile is not None and failure_rate is not None:
        raise InvalidInputError("give either --profile or --failure-rate, not both")
    if not compare and (sizes is not None or seeds is not None):
        raise InvalidInputError("--sizes and --seeds go with --compare")
    rate = failure_rate if failure_rate is not None else find_profile(profile or DEFAULT_PROFILE).failures_per_1000_node_days
    if jobs is not None and not 1 <= jobs <= 256:
        raise InvalidInputError(f"--jobs {jobs} is out of range: give 1 to 256")
    config = SimConfig(
        nodes=nodes,
        days=days,
        seed=seed,
        device_type=device_type,
        failures_per_1000_node_days=rate,
        repair_s=repair_minutes * 60.0,
        checkpoint_interval_s=checkpoint_minutes * 60.0,
        elastic_snapshot_s=elastic_snapshot_minutes * 60.0,
        policies=tuple(policy) if policy else tuple(POLICIES),
    )
    if compare_victims:
        from hotswap.cli.simulate_victims import run_victims

        run_victims(config, compare, plot, policy, as_json)
    elif compare:
        _compare(config, _sizes(sizes, config), 5 if seeds is None else seeds, jobs, as_json, plot)
    else:
        _single(config, jobs, as_json, plot)


def _sizes(text: str | None, config: SimConfig) -> list[int]:
    import dataclasses

    from hotswap.api.errors import InvalidInputError
    from hotswap.sim.sweep import ladder

    if text is None:
        return ladder(config.nodes, config.hosts_per_slice)
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise InvalidInputError(f"--sizes {text!r}: give node counts separated by commas, e.g. 1024,4096") from None
    if not values:
        raise InvalidInputError("--sizes is empty: give node counts separated by commas, e.g. 1024,4096")
    for value in values:
        try:
            dataclasses.replace(config, nodes=value)  # each size is checked like --nodes
        except InvalidInputError as error:
            raise InvalidInputError(str(error).replace("--nodes", "--sizes", 1)) from None
    return values


def _single(config: SimConfig, workers: int | None, as_json: bool, plot: Path | None) -> None:
    from hotswap.sim.runner import compare

    with _ProgressBar(len(config.policies)) as update:
        comparison = compare(config, workers, update)
    if plot is not None:
        from hotswap.cli.plotting import drawing
        from hotswap.sim.plot import plot_comparison

        with drawing():  # says so if matplotlib builds its font cache first
            plot_comparison(comparison, plot)
    summary = comparison.to_dict()
    summary["wall_s"] = round(seconds_since_start(), 3)  # the command's, from its start (each run's own is its wall_s)
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    _print_single(summary)
    if plot is not None:
        print(f"chart written to {plot}")


def _compare(
    config: SimConfig, sizes: list[int], seeds: int, workers: int | None, as_json: bool, plot: Path | None
) -> None:
    from hotswap.sim.sweep import sweep

    with _ProgressBar(len(sizes) * seeds * len(config.policies)) as update:
        result = sweep(config, sizes, seeds, workers, update)
    if plot is not None:
        from hotswap.cli.plotting import drawing
        from hotswap.sim.plot import plot_sweep

        with drawing():  # says so if matplotlib builds its font cache first
            plot_sweep(result, plot)
    document = result.to_dict()
    document["wall_s"] = round(seconds_since_start(), 3)  # the command's, from its start
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    _print_sweep(result, document["wall_s"])
    if plot is not None:
        print(f"chart written to {plot}")


class _ProgressBar:
    """A progress bar on stderr (only on a terminal) over ``runs`` simulations."""

    def __init__(self, runs: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        self._progress = Progress(
            TextColumn("simulating"), BarColumn(), TextColumn("{task.completed:.1f}/{task.total:g} runs"),
            TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal,
        )
        self._task = self._progress.add_task("runs", total=runs)
        self._done: dict[tuple[int, int, str], float] = {}

    def __enter__(self) -> Callable[[SimConfig, str, float], None]:
        self._progress.__enter__()

        def update(config: SimConfig, policy: str, fraction: float) -> None:
            self._done[(config.nodes, config.seed, policy)] = fraction
            self._progress.update(self._task, completed=sum(self._done.values()))

        return update

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)  # type: ignore[arg-type]


def _title(config: SimConfig, extra: str) -> str:
    return (
        f"{config.device_type}, {config.days:g} days, {extra}; {config.failures_per_1000_node_days:g} failures/1000"
        f" node-days, repair {config.repair_s / 60:g} min, checkpoint every {config.checkpoint_interval_s / 60:g} min"
    )


def _print_sweep(result: Sweep, wall_s: float) -> None:
    """Metrics down, policies across, at the largest size (every size is in --json): fits a
    terminal of 80 columns."""
    from rich.console import Console
    from rich.table import Table

    from hotswap.sim.sweep import METRIC_LABELS

    nodes = result.sizes[-1]
    config = result.base
    seeds = len(result.seeds)
    table = Table(title=_title(config, f"{nodes:,} nodes, mean of {seeds} seed(s) ± 95% CI"), title_justify="left")
    table.add_column("")
    for policy in config.policies:
        table.add_column(policy, justify="right")
    estimates = {policy: result.estimates(policy, nodes) for policy in config.policies}
    for key, (label, fmt) in METRIC_LABELS.items():
        cells = []
        for policy in config.policies:
            e = estimates[policy].get(key)
            cells.append("-" if e is None else fmt.format(e.mean) + (f" ± {fmt.format(e.ci95)}" if seeds > 1 else ""))
        table.add_row(label, *cells)
    Console().print(table)
    print(f"simulated {len(result.runs)} runs; the command took {wall_s:.1f} s")


def _print_single(summary: dict) -> None:
    """Metrics down, policies across: fits a terminal of 80 columns."""
    from rich.console import Console
    from rich.table import Table

    from hotswap.sim.runner import LEVELS

    policies = summary["policies"]
    present = [lv for lv in LEVELS if any(lv in p["goodput_by_priority"] for p in policies.values())]
    p = summary["params"]
    table = Table(
        title=(
            f"{summary['nodes']:,} nodes = {summary['slices']:,} x {summary['device_type']}, {summary['days']:g} days,"
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
    table.add_row("goodput, all other work", *(f"{r['low_priority_goodput']:.3f}" for r in policies.values()))
    table.add_row("spare capacity used", *(f"{r['spare_capacity_used']:.3f}" for r in policies.values()))
    table.add_row("MTTR p50/p99 very-high (s)", *(_pair(r["mttr_by_priority_s"].get("very-high", {})) for r in policies.values()))
    table.add_row("MTTR p50/p99 all jobs (s)", *(_pair(r["mttr_s"]) for r in policies.values()))
    table.add_row("restarts, very-high job", *(str(r["main_restarts"]) for r in policies.values()))
    table.add_row("preemptions", *(str(r["preemptions"]) for r in policies.values()))
    table.add_row("node failures", *(str(r["failures"]) for r in policies.values()))
    table.add_row("failures under a job", *(str(r["disruptions"]) for r in policies.values()))
    table.add_row("jobs completed", *(str(r["completed_jobs"]) for r in policies.values()))
    Console().print(table)
    print(f"simulated; the command took {summary['wall_s']:.1f} s")


def _pair(mttr: dict) -> str:
    if not mttr or mttr.get("p50") is None:
        return "-"
    return f"{mttr['p50']:.0f} / {mttr['p99']:.0f}"
