"""``hotswap dashboard --cluster C``: a live web view of a cluster (``hotswap[dashboard]``).

The web libraries are imported only once the command runs, so ``hotswap --help`` stays fast.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import typer

TOKEN_VARIABLE = "HOTSWAP_DASHBOARD_TOKEN"
DEFAULT_PORT = 8787


def require_libraries() -> None:
    """One line naming the extra when the web libraries are missing."""
    import importlib.util

    from hotswap.api.errors import InvalidInputError

    missing = [name for name in ("starlette", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise InvalidInputError(f"the dashboard needs {', '.join(missing)}: pip install 'hotswap[dashboard]'")


def start_dashboard(
    cluster: str, host: str, port: int, token: str | None, interval_s: float | None = None, log: Callable[[str], None] | None = None,
) -> Any:
    """A dashboard of ``cluster`` (not yet serving: call ``start`` or ``serve_forever``)."""
    from hotswap.cli import backends
    from hotswap.dashboard.server import Dashboard
    from hotswap.dashboard.source import ClusterSource

    require_libraries()
    interval = interval_s if interval_s is not None else backends.for_cluster_or_demo(cluster).capabilities.dashboard_interval_s
    source = ClusterSource(cluster, lambda: backends.for_cluster(cluster), interval_s=interval, log=log)
    return Dashboard(source, host, port, token)


def dashboard(
    cluster: str = typer.Option(..., "--cluster", help="Cluster name."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback unless --expose)."),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="Port to listen on (0: any free port).", min=0, max=65535),
    expose: bool = typer.Option(False, "--expose", help="Allow a --host beyond loopback (needs --token)."),
    token: str | None = typer.Option(
        None, "--token", envvar=TOKEN_VARIABLE, show_envvar=True,
        help="Every request must carry it (given once as ?token=, then a cookie). Required with --expose.",
    ),
    interval: float | None = typer.Option(None, "--interval", help="Seconds between looks at the cluster (default 0.5 local, 2 Kubernetes).", min=0.1, max=60),
) -> None:
    """Serve a live, read-only web view of a cluster: slices, queue, workloads, timeline, goodput."""
    from hotswap.dashboard.server import check_binding
    from hotswap.store import registry

    check_binding(host, expose, token)
    registry.record_of(cluster)  # an unknown cluster: one line, nothing served
    board = start_dashboard(cluster, host, port, token, interval)
    where = "loopback only" if not expose else f"exposed on {host}, token required"
    print(f"hotswap dashboard of cluster {cluster}: {board.url} ({where}, read-only; Ctrl-C stops)", file=sys.stderr)
    board.serve_forever()
