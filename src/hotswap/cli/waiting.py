"""Waiting and watching, so users need no shell loops: ``workload create|delete --wait`` and
``workload list --watch``.

A wait polls the backend for a state (RUNNING, finished, gone) with a progress line on stderr
(rewritten in place on a terminal, one line per change otherwise) and gives up after
``--timeout`` seconds with exit code 124 (a failed workload: 125). A watch redraws the list
on change: a rich Live view on a terminal; elsewhere a new block, or one compact JSON/YAML
document, only when something changed. Ctrl-C ends a watch with exit 0 (its normal end).
"""

from __future__ import annotations

import enum
import sys
import time
from collections.abc import Callable
from typing import Any

from hotswap.api.catalog import get_device_type
from hotswap.api.errors import InvalidInputError, NotFoundError, WaitTimeoutError, WorkloadFailedError
from hotswap.cli.output import Format, fit, plain_table, render_document, rich_table, terminal_width

POLL_S = 0.25


class Until(str, enum.Enum):
    RUNNING = "running"
    FINISHED = "finished"


def check_timeout(timeout: float | None) -> None:
    if timeout is not None and not timeout > 0:
        raise InvalidInputError(f"--timeout {timeout:g}: must be a positive number of seconds")


class Progress:
    """One progress line on stderr: rewritten in place on a terminal, printed per change otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = ""

    def show(self, text: str, elapsed: float) -> None:
        if self.tty:
            sys.stderr.write(f"\r\x1b[2K{text} ({elapsed:.0f}s)")
            sys.stderr.flush()
        elif text != self.last:
            print(text, file=sys.stderr, flush=True)
        self.last = text

    def done(self, text: str) -> None:
        if self.tty:
            sys.stderr.write("\r\x1b[2K")
        print(text, file=sys.stderr, flush=True)


SETTLE_S = 1.0  # how long every worker must have run without a failure (Kubernetes' minReadySeconds)


def reached(view: dict[str, Any], until: Until) -> bool:
    """Whether ``view`` is the awaited state at this moment; raises if it can never be (the
    workload failed). :func:`wait_for_state` also asks that it holds for :data:`SETTLE_S`."""
    return awaited(view, until) is not None


def awaited(view: dict[str, Any], until: Until) -> tuple[str, ...] | None:
    """What identifies the awaited state in ``view`` (None: not reached). ``--until running``:
    every worker of the current attempt has started, by its own record (the pid its shim wrote;
    a pod's Running phase), and none has failed; the workers' ids, so that a restart between two
    looks is seen. A workload that finished successfully counts. Raises on a failed workload."""
    status = view["status"]
    if status == "FAILED":
        reason = view["status_message"] or "no reason recorded"
        reason = reason[len("failed: "):] if reason.startswith("failed: ") else reason  # said once
        raise WorkloadFailedError(f"workload {view['name']} failed: {reason}")
    if status == "SUCCESSFUL":
        return ("SUCCESSFUL",)
    if until is not Until.RUNNING or status != "RUNNING":
        return None
    return _started_workers(view)


def _started_workers(view: dict[str, Any]) -> tuple[str, ...] | None:
    try:
        hosts = get_device_type(view["device_type"]).hosts_per_slice
    except Exception:  # a view without a known device type: one worker per slice
        hosts = 1
    expected = len(view.get("slices") or ()) * hosts
    current = [w for w in view.get("workers") or () if w.get("attempt") == view.get("attempt")]
    started = [w for w in current if w["state"] == "running" or (w["state"] == "exited" and w["exit_code"] == 0)]
    if not expected or len(started) < expected or len(started) < len(current):
        return None  # one has not started yet, or one has failed (the controller decides what next)
    return tuple(sorted(f"{w['slice']}/{w['host']}/{w['pid']}" for w in started))


def _waiting_for(view: dict[str, Any], until: Until) -> str:
    if until is Until.RUNNING and view["status"] == "RUNNING":
        workers = [w for w in view.get("workers") or () if w.get("attempt") == view.get("attempt")]
        failed = [w for w in workers if w["state"] == "exited" and w["exit_code"] not in (0, None)]
        if failed:
            w = failed[0]
            return f"worker {w['slice']}/{w['host']} exited with code {w['exit_code']}"
        return f"{sum(w['state'] == 'running' for w in workers)} worker(s) started"
    return f"{view['status']} ({view['status_message']})"


def wait_for_state(
    describe: Callable[[], dict[str, Any]], name: str, until: Until, timeout: float | None,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Poll ``describe`` until the workload is running (every worker started, none failed, for
    :data:`SETTLE_S`) or finished; return its view."""
    progress = Progress()
    started = clock()
    seen: tuple[str, ...] | None = None
    seen_at = started
    while True:
        view = describe()
        key = awaited(view, until)
        now = clock()
        if key != seen:
            seen, seen_at = key, now
        if key is not None and (key == ("SUCCESSFUL",) or now - seen_at >= SETTLE_S):
            progress.done(f"workload {name} is {view['status']} ({view['status_message']})")
            return view
        elapsed = now - started
        if timeout is not None and elapsed >= timeout:
            raise WaitTimeoutError(
                f"timed out after {timeout:g}s waiting for workload {name} to be {until.value}:"
                f" it is {view['status']} ({view['status_message']})"
            )
        progress.show(f"waiting for workload {name} to be {until.value}: {_waiting_for(view, until)}", elapsed)
        sleep(POLL_S)


def wait_until_gone(
    gone: Callable[[], bool], name: str, timeout: float | None,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Poll ``gone`` until the deleted workload and its workers are gone."""
    progress = Progress()
    started = clock()
    while not gone():
        elapsed = clock() - started
        if timeout is not None and elapsed >= timeout:
            raise WaitTimeoutError(f"timed out after {timeout:g}s waiting for workload {name}'s workers to stop")
        progress.show(f"waiting for workload {name}'s workers to stop (checkpoint, then exit)", elapsed)
        sleep(POLL_S)
    progress.done(f"workload {name} is gone")


def watch(
    fetch: Callable[[], list[dict[str, Any]]],
    columns: list[str],
    row: Callable[[dict[str, Any]], list[str]],
    hide_first: list[str],
    fmt: Format,
    interval: float,
) -> None:
    """Show ``fetch()`` and show it again whenever it changes, until Ctrl-C."""
    try:
        if fmt is Format.TABLE and sys.stdout.isatty():
            _watch_live(fetch, columns, row, hide_first, interval)
        else:
            _watch_blocks(fetch, columns, row, fmt, interval)
    except KeyboardInterrupt:
        return  # the usual way to stop watching
    except NotFoundError as error:
        raise NotFoundError(f"{error} (stopped watching)") from None


def _watch_blocks(
    fetch: Callable[[], list[dict[str, Any]]], columns: list[str], row: Callable[[dict[str, Any]], list[str]],
    fmt: Format, interval: float,
) -> None:
    last: str | None = None
    while True:
        views = fetch()
        if fmt is Format.TABLE:
            text = plain_table(columns, [row(v) for v in views])
        else:
            text = render_document(views, fmt, compact=True)
            if fmt is Format.YAML:
                text = "---\n" + text
        if text != last:
            # A blank line between tables, so each block reads on its own (awk: RS="").
            sys.stdout.write(("\n" if last is not None and fmt is Format.TABLE else "") + text)
            sys.stdout.flush()
            last = text
        time.sleep(interval)


def _watch_live(
    fetch: Callable[[], list[dict[str, Any]]], columns: list[str], row: Callable[[dict[str, Any]], list[str]],
    hide_first: list[str], interval: float,
) -> None:
    from rich.console import Console
    from rich.live import Live

    def render() -> tuple[Any, list[list[str]], int]:
        rows = [row(v) for v in fetch()]
        width = terminal_width()
        return rich_table(fit(columns, rows, width, hide_first), rows), rows, width

    table, rows, width = render()
    with Live(table, console=Console(), auto_refresh=False, transient=False) as live:
        while True:
            time.sleep(interval)
            table, new_rows, new_width = render()
            if (new_rows, new_width) != (rows, width):  # a resized terminal redraws too
                live.update(table, refresh=True)
                rows, width = new_rows, new_width
