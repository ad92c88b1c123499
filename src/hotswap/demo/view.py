"""What the person running the demo sees while it runs (on stderr, so stdout can hold JSON).

On a terminal: a live view (slices and who holds them, the jobs with their state, step and
loss) above a scrolling list of events. Otherwise: the events, one line each.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

Snapshot = Callable[[], dict[str, Any]]
REDRAW_EVERY_S = 0.5


class DemoView:
    def __init__(self, title: str, snapshot: Snapshot, live: bool | None = None, started: float | None = None) -> None:
        from rich.console import Console

        self.title = title
        self.snapshot = snapshot
        self.console = Console(stderr=True)
        self.live_enabled = self.console.is_terminal if live is None else live
        self.started = time.time() if started is None else started  # epoch s: events are timed from it
        self.events: list[str] = []
        self._live = None
        self._drawn = 0.0

    def __enter__(self) -> DemoView:
        if self.live_enabled:
            from rich.live import Live

            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        else:
            self.console.print(f"[bold]{self.title}[/bold]")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(*exc)

    def event(self, message: str) -> None:
        line = f"{time.time() - self.started:6.1f}s  {message}"
        self.events.append(line)
        if self._live is None:
            print(line, file=sys.stderr, flush=True)
        else:
            self._live.update(self._render())

    def refresh(self) -> None:
        """Redraw, at most a few times a second: reading every worker's events costs CPU the
        training processes need."""
        if self._live is not None and time.monotonic() - self._drawn >= REDRAW_EVERY_S:
            self._live.update(self._render())

    def _render(self) -> Any:
        self._drawn = time.monotonic()
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        state = self.snapshot()
        slices = Table(title="slices", title_justify="left", box=None, header_style="bold")
        for column in ("slice", "nodes", "held by"):
            slices.add_column(column)
        for item in state.get("slices", []):
            nodes = ", ".join(f"{n['name'].rsplit('-', 1)[-1]}:{n['state']}" for n in item["nodes"])
            slices.add_row(item["name"], nodes, item.get("workload") or "-")
        jobs = Table(title="jobs", title_justify="left", box=None, header_style="bold")
        for column in ("job", "priority", "status", "slices", "step", "loss", "message"):
            jobs.add_column(column)
        for job in state.get("jobs", []):
            loss = job.get("loss")
            jobs.add_row(
                job["name"], job["priority"], job["status"], ",".join(job["slices"]) or "-",
                str(job.get("step") or "-"), f"{loss:.4f}" if loss is not None else "-", job["status_message"][:60],
            )
        events = Text("\n".join(self.events[-12:]))
        return Group(Text(self.title, style="bold"), slices, jobs, Text("events", style="bold"), events)
