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
    interval = interval_s if interval_s is not None else backends.for_cluster_or_demo(cluster).dashboard_interval_s
    source = ClusterSource(cluster, lambda: backends.for_cluster(cluster), interval_s=interval, log=log)
    return Dashboard(source, host, port, token)


def read_token(flag: str | None, token_file: str | None, environ: dict[str, str]) -> str | None:
    """The dashboard's token, from one of --token-file, HOTSWAP_DASHBOARD_TOKEN or --token
    (the last shows in /proc/PID/cmdline to every user of the machine). A token given but
    blank is an error wherever it came from: it never turns authentication off."""
    import os
    import stat

    from hotswap.api.errors import InvalidInputError
    from hotswap.dashboard.server import check_token

    if flag is not None and token_file is not None:
        raise InvalidInputError("give the token once: --token-file or --token, not both")
    if token_file is not None:
        try:
            with open(token_file, "rb") as handle:
                mode = os.fstat(handle.fileno()).st_mode
                raw = handle.read(4097)
        except OSError as error:
            raise InvalidInputError(f"--token-file {token_file}: {error.strerror or error}") from None
        if not stat.S_ISREG(mode) or len(raw) > 4096:
            raise InvalidInputError(f"--token-file {token_file}: not a token file (a regular file, at most 4 KiB)")
        if mode & 0o077:
            raise InvalidInputError(f"--token-file {token_file} can be read by others: chmod 600 {token_file}")
        try:
            token = raw.decode().removesuffix("\n").removesuffix("\r")
        except UnicodeDecodeError:
            raise InvalidInputError(f"--token-file {token_file}: not UTF-8") from None
        check_token(token, f"the token in {token_file}")
        return token
    if flag is not None:
        check_token(flag, "--token")
        return flag
    if TOKEN_VARIABLE in environ:
        check_token(environ[TOKEN_VARIABLE], TOKEN_VARIABLE)
        return environ[TOKEN_VARIABLE]
    return None


def dashboard(
    cluster: str = typer.Option(..., "--cluster", help="Cluster name."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback unless --expose)."),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="Port to listen on (0: any free port).", min=0, max=65535),
    expose: bool = typer.Option(False, "--expose", help="Allow a --host beyond loopback (needs a token)."),
    token_file: str | None = typer.Option(
        None, "--token-file",
        help=f"Read the token from this owner-only file (or set {TOKEN_VARIABLE}). Every request must carry it"
        " (given once as ?token=, then a cookie). Required with --expose: 16+ visible characters.",
    ),
    token: str | None = typer.Option(
        None, "--token",
        help=f"The token itself: visible to every user of this machine in /proc/PID/cmdline; prefer --token-file or {TOKEN_VARIABLE}.",
    ),
    interval: float | None = typer.Option(None, "--interval", help="Seconds between looks at the cluster (default 0.5 local, 2 Kubernetes).", min=0.1, max=60),
) -> None:
    """Serve a live, read-only web view of a cluster: slices, queue, workloads, timeline, goodput."""
    import os

    from hotswap.dashboard.server import check_binding
    from hotswap.store import registry

    secret = read_token(token, token_file, dict(os.environ))
    check_binding(host, expose, secret)
    registry.record_of(cluster)  # an unknown cluster: one line, nothing served
    if token is not None:
        print(f"warning: --token shows in /proc/PID/cmdline to every user of this machine; use --token-file or {TOKEN_VARIABLE}", file=sys.stderr)
    board = start_dashboard(cluster, host, port, secret, interval)
    where = "loopback only" if not expose else f"exposed on {host}, token required"
    print(f"hotswap dashboard of cluster {cluster}: {board.url} ({where}, read-only; Ctrl-C stops)", file=sys.stderr)
    board.serve_forever()
