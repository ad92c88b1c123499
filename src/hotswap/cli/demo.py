"""``hotswap demo [hotswap|elastic|migration|shrink] [--framework torch|jax]``: the main job, a real drill on this machine."""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Any

import typer

from hotswap.cli.started import command_started_at, seconds_since_start


class Backing(str, enum.Enum):
    AUTO = "auto"
    GPU = "gpu"
    EMULATED = "emulated"


class Scenario(str, enum.Enum):
    HOTSWAP = "hotswap"
    ELASTIC = "elastic"
    MIGRATION = "migration"
    GPU = "gpu"
    SHRINK = "shrink"


class Framework(str, enum.Enum):
    TORCH = "torch"
    JAX = "jax"


def demo(
    scenario: Scenario = typer.Argument(Scenario.HOTSWAP, help="hotswap (seed 000), elastic (seed 001), migration (seed 004), gpu (GPU state saved on preemption, resumed bit for bit) or shrink (a high-priority job shrinks an elastic low-priority one instead of evicting it)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object on stdout."),
    plot: Path | None = typer.Option(None, "--plot", help="Write a timeline (slices over time, failures and repairs) to this PNG.", dir_okay=False),
    keep: bool = typer.Option(False, "--keep", help="Keep the drill's cluster, logs and checkpoints for inspection."),
    warm: bool = typer.Option(True, "--warm/--no-warm", help="hotswap: also fail over onto warm spare workers."),
    step_sleep: float = typer.Option(0.05, "--step-sleep", help="Seconds per training step (slower is easier to watch).", min=0.0),
    backing: Backing = typer.Option(Backing.AUTO, "--backing", help="auto (this machine's GPUs, one per slice, when enough are free), gpu, or emulated."),
    state_gb: float = typer.Option(1.2, "--state-gb", help="gpu: model + optimizer state on the GPU, in GB.", min=0.001),
    framework: Framework = typer.Option(Framework.TORCH, "--framework", help="torch, or jax (hotswap, elastic and migration drills; needs hotswap[jax])."),
    fail_slice: int = typer.Option(1, "--fail-slice", help="elastic: which of the job's 3 slices loses its node (0, 1 or 2).", min=0, max=2),
    dashboard: bool = typer.Option(False, "--dashboard", help="Watch the drill live in a browser (hotswap[dashboard]; on 127.0.0.1)."),
    dashboard_port: int = typer.Option(8787, "--dashboard-port", help="Port of --dashboard (0: any free port).", min=0, max=65535),
) -> None:
    """Run a real drill: training jobs (PyTorch, or JAX with --framework jax) on a fresh local cluster, real failures, real recovery.

    It creates its own cluster, trains the SDK example with one process per slice, injects the
    fault, measures MTTR from the training logs, checks what must hold, and removes the cluster
    (unless --keep). Exit code 1 if a check failed.
    """
    from hotswap.api.errors import InvalidInputError

    if plot is not None and (plot.suffix.lower() != ".png" or not plot.parent.exists()):
        raise InvalidInputError(f"--plot {plot}: give a .png file in an existing directory")
    if framework is Framework.JAX:
        drills = _jax_drills(scenario)
    else:
        import importlib.util

        # Found, not imported: the workers import torch; importing it here cost seconds of this
        # command's start (tens of them on a loaded host) and of its exit, for nothing.
        if _not_installed(importlib.util, "torch"):
            raise InvalidInputError("the demo trains real PyTorch jobs: pip install torch==2.13.0 'hotswap[torch]' first")
        from hotswap.demo.scenarios import DRILLS as drills
    from hotswap.demo.drills import DemoOptions

    if framework is Framework.JAX:
        if backing is Backing.GPU:
            raise InvalidInputError("--backing gpu: the JAX drills train on emulated (CPU) slices; use --framework torch")
        backing = Backing.EMULATED  # JAX's CPU collectives (gloo): the drills' workers use no GPU
    drill = drills[scenario.value](
        DemoOptions(keep=keep, warm=warm, step_sleep=step_sleep, backing=backing.value, state_gb=state_gb, fail_slice=fail_slice,
                    started_at=command_started_at())
    )
    board = _open_dashboard(drill.cluster, dashboard_port) if dashboard else None
    try:
        summary = drill.run()
    finally:
        if board is not None:
            board.stop()
    if plot is not None:
        from hotswap.cli.plotting import drawing
        from hotswap.demo.plot import plot_drill

        with drawing() as drawn:
            plot_drill(summary, plot)
        summary["plot"] = str(plot)
        summary["plot_s"] = round(drawn.seconds, 1)  # part of wall_s, said beside the path
        summary["plot_font_cache"] = str(drawn.font_cache) if drawn.font_cache else None  # built first, in there
    summary["wall_s"] = round(seconds_since_start(), 1)  # the command's, from its start to here, its end
    public = {k: v for k, v in summary.items() if k not in ("timeline", "progress")}
    if as_json:
        sys.stdout.write(json.dumps(public, indent=2, default=str) + "\n")
    else:
        _print_summary(public)
    if not summary["passed"]:
        raise typer.Exit(1)


def _open_dashboard(cluster: str, port: int) -> Any:
    """The drill's dashboard, served from this process while the drill runs (its page says the
    cluster does not exist yet for the moment before the drill creates it)."""
    import contextlib
    import os
    import webbrowser

    from hotswap.cli.dashboard import start_dashboard
    from hotswap.store import registry

    def log(line: str) -> None:
        if registry.find(cluster) is not None:  # before the drill creates its cluster, the page says so
            print(line, file=sys.stderr, flush=True)

    board = start_dashboard(cluster, "127.0.0.1", port, None, 0.25, log)
    board.start()
    print(f"hotswap dashboard of the drill: {board.url} (loopback only, read-only)", file=sys.stderr)
    if sys.stderr.isatty() and (sys.platform == "darwin" or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        with contextlib.suppress(webbrowser.Error, OSError):  # a broken browser setting must not stop the drill
            webbrowser.open(board.url)  # only with a display: never a text browser in this terminal
    return board


def _jax_drills(scenario: Scenario) -> dict[str, Any]:
    """The JAX drills, once JAX is known to be installed (found, not imported: the workers
    import it, this process never does)."""
    import importlib.util

    from hotswap.api.errors import InvalidInputError

    missing = [name for name in ("jax", "orbax.checkpoint", "optax") if _not_installed(importlib.util, name)]
    if missing:
        raise InvalidInputError(f"the JAX drills train real JAX jobs ({', '.join(missing)} missing): pip install 'hotswap[jax]' first")
    from hotswap.demo.jax_drills import JAX_DRILLS

    if scenario.value not in JAX_DRILLS:
        raise InvalidInputError(
            f"--framework jax runs the {', '.join(sorted(JAX_DRILLS))} drills; the {scenario.value} drill trains PyTorch jobs"
        )
    return JAX_DRILLS


def _not_installed(util: Any, name: str) -> bool:
    try:
        return util.find_spec(name) is None
    except ModuleNotFoundError:  # a parent package is missing
        return True


def _no_spare_label(summary: dict[str, Any]) -> str:
    how = "no spare, forked from the zygote" if summary.get("zygote") else "cold restart"
    return f"MTTR (failure -> first training step), {how}"


def _print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from hotswap.cli.output import goodput_words

    console = Console()
    title = f"hotswap demo {summary['scenario']}" + (f" --framework {summary['framework']}" if summary.get("framework", "torch") != "torch" else "")
    table = Table(title=f"{title}: summary", title_justify="left", box=None, show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    if summary.get("mttr_s") is not None:
        label = (
            _no_spare_label(summary) if "mttr_warm_s" in summary
            else "MTTR (created again -> first training step)" if summary["scenario"] == "migration"
            else "high's MTTR (submitted -> first training step; low shrank for it)" if summary["scenario"] == "shrink"
            else "MTTR (failure -> first training step)"
        )
        table.add_row(label, f"{summary['mttr_s']:.2f} s")
    if summary.get("mttr_warm_s") is not None:
        table.add_row("MTTR onto warm spare workers", f"{summary['mttr_warm_s']:.2f} s")
    if summary.get("stall_down_s") is not None:
        table.add_row("survivors' stall on the way down (last step on 3 slices -> first on 2)", f"{summary['stall_down_s']:.2f} s")
    if summary.get("stall_up_s") is not None:
        table.add_row(
            "survivors' stall on grow-back (last step on 2 slices -> first on 3)",
            f"{summary['stall_up_s']:.2f} s (a step usually takes {summary['usual_step_s']:.2f} s)",
        )
    if summary.get("wait_for_repair_s") is not None:
        table.add_row("waiting for a 10-minute repair instead", f"about {summary['wait_for_repair_s']:.0f} s down")
    if summary.get("low_slices"):
        table.add_row("low's slices (shrunk for high, grown back)", " -> ".join(str(k) for k in summary["low_slices"]))
    if summary.get("steps_lost") is not None:
        table.add_row("steps lost", str(summary["steps_lost"]))
    table.add_row("preempted", ", ".join(summary.get("preempted") or []) or "none")
    if summary.get("save"):
        save, raw = summary["save"], summary["raw_write"]
        table.add_row(
            f"SIGTERM save of {save['bytes'] / 1e9:.2f} GB from {summary.get('device')}",
            f"{save['seconds']:.2f} s ({save['bytes_per_s'] / 1e9:.2f} GB/s); raw write+fsync of the same bytes"
            f" {raw['seconds']:.2f} s ({raw['bytes_per_s'] / 1e9:.2f} GB/s)",
        )
    for job, good in (summary.get("goodput") or {}).items():
        figure, spent = goodput_words(good, at_least=0.0009)
        why = f"; {good['reason']}" if good.get("reason") else ""
        table.add_row(f"goodput of {job}", f"{figure} over {good['wall_s']:.0f} s ({spent}{why})")
    if summary.get("awk_output"):
        table.add_row("seed 001's awk script", summary["awk_output"].strip())
    console.print(table)
    # Paths whole, on lines of their own (a table cell would cut them to the terminal's width).
    console.print(f"training log (rank 0): {summary.get('logs')}", soft_wrap=True, highlight=False)
    if summary.get("plot"):
        built = ", matplotlib's font cache built first: first use only" if summary.get("plot_font_cache") else ""
        console.print(f"timeline: {summary['plot']} (drawn in {summary['plot_s']:.1f} s{built})", soft_wrap=True, highlight=False)
    for check in summary["checks"]:
        mark = "[green]PASS[/green]" if check["passed"] else "[red]FAIL[/red]"
        console.print(f"{mark} {check['name']}: {check['detail']}")
    console.print(f"{'passed' if summary['passed'] else 'FAILED'} in {summary['wall_s']:.0f} s")
