"""``hotswap simulate --compare-victims``: least lost work (hotswap) against newest first (Kueue),
on the same failures and jobs (:mod:`hotswap.sim.victims`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hotswap.sim.config import SimConfig


def run_victims(config: SimConfig, compare: bool, plot: Path | None, policies: list[str], as_json: bool) -> None:
    from hotswap.api.errors import InvalidInputError
    from hotswap.cli.started import seconds_since_start
    from hotswap.sim.victims import DEFAULT_POLICY, compare_victims

    if compare:
        raise InvalidInputError("--compare-victims runs one cluster and seed: leave out --compare")
    if plot is not None:
        raise InvalidInputError("--compare-victims draws no chart: leave out --plot (--json gives every figure)")
    if len(policies) > 1:
        raise InvalidInputError("--compare-victims compares victims under one policy: give at most one --policy")
    comparison = compare_victims(config, policies[0] if policies else DEFAULT_POLICY)
    document = comparison.to_dict()
    document["wall_s"] = round(seconds_since_start(), 3)  # the command's, from its start
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    _print(document)


def _print(document: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    runs = document["victims"]
    table = Table(
        title=(
            f"{document['nodes']:,} nodes = {document['slices']:,} x {document['device_type']}, {document['days']:g} days,"
            f" seed {document['seed']}, policy {document['policy']}: {document['failures']} node failures;"
            f" victims lose {document['victims_lose']}, checkpoint every {document['checkpoint_interval_s'] / 60:g} min"
        ),
        title_justify="left",
    )
    table.add_column("")
    for name in runs:
        table.add_column(name + (" (hotswap)" if name == "least-lost-work" else " (Kueue)"), justify="right")
    table.add_row("work lost by victims (slice-hours)", *(f"{r['lost_slice_hours']:.1f}" for r in runs.values()))
    table.add_row("preemptions", *(str(r["preemptions"]) for r in runs.values()))
    table.add_row("lost per preemption (slice-minutes)", *(f"{r['lost_slice_minutes_per_preemption']:.1f}" for r in runs.values()))
    table.add_row("goodput, lower-priority work", *(f"{r['low_priority_goodput']:.3f}" for r in runs.values()))
    table.add_row("goodput, very-high job", *(f"{r['main_goodput']:.3f}" for r in runs.values()))
    Console().print(table)
    ratio = document["lost_work_ratio"]
    if ratio is not None:
        print(
            f"least lost work loses {ratio:.2f}x the work newest first loses"
            f" ({document['lost_slice_hours_saved']:.1f} slice-hours saved)"
        )
    else:
        print("no victim lost any work under either rule")
