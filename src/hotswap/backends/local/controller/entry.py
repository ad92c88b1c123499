"""How a local cluster's controller is started: the daemon the CLI spawns (``python -m`` this
module, see :func:`main`) and ``hotswap controller run`` (:func:`run_local_controller`).

Both put the controller together with ``assembly.py`` (claim, read, build each collaborator,
take over) and run its loop. Kept light on purpose: the CLI names this module (and imports it
for ``controller run``), so the loop (and the core behind it) is imported only when a
controller actually runs.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hotswap.store.paths import ClusterPaths


def run_local_controller(cluster: str, metrics_address: str | None = None) -> None:
    """``hotswap controller run`` for a local cluster: serve it from this process until a
    signal ends it (a one-line error when a controller serves it already), with Prometheus
    metrics on ``metrics_address`` when given."""
    from hotswap.api.errors import ConflictError
    from hotswap.backends.kit.metrics import serve_metrics
    from hotswap.backends.local.claim import LostClaim
    from hotswap.backends.local.controller.assembly import AlreadyRunning, serve
    from hotswap.store import registry

    paths = registry.existing(cluster)
    try:  # the metrics are served (and their URL said) only once the cluster is claimed
        serve(paths, (lambda: serve_metrics(cluster, metrics_address)) if metrics_address else None)
    except AlreadyRunning:
        raise ConflictError(_already_running(paths)) from None
    except LostClaim as lost:
        raise ConflictError(f"{lost}; this controller stopped and left the workers alone") from None


def _already_running(paths: ClusterPaths) -> str:
    """Who holds the cluster, from the database's record (its pid file may have been removed);
    the holder is woken to listen on its socket again, in case that was removed too."""
    from hotswap.backends.local.claim import holder_pid, wake_holder
    from hotswap.store.state import Store

    pid = None
    with contextlib.suppress(Exception), Store.open(paths.database) as store:
        pid = holder_pid(store)
        wake_holder(store)
    held = f"pid {pid}" if pid is not None else "held by another process: a controller, or a `cluster delete`"
    return f"the controller of cluster {paths.name} is already running ({held}); only one runs per cluster"


def main(argv: list[str] | None = None) -> int:
    """The daemon: ``python -m hotswap.backends.local.controller.entry <cluster-dir>``; its exit
    code is a :class:`~hotswap.backends.local.protocol.ControllerExit`."""
    from hotswap.api.errors import HotswapError
    from hotswap.backends.local.claim import LostClaim, wake_holder
    from hotswap.backends.local.controller.assembly import AlreadyRunning, serve
    from hotswap.backends.local.protocol import ControllerExit
    from hotswap.store import faults
    from hotswap.store.paths import ClusterPaths
    from hotswap.store.state import Store

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hotswap.backends.local.controller.entry <cluster-dir>", file=sys.stderr)
        return 2
    root = Path(args[0])
    paths = ClusterPaths(root.name, root)
    try:
        serve(paths)
    except AlreadyRunning:
        with contextlib.suppress(Exception), Store.open(paths.database) as store:
            wake_holder(store)  # the CLI could not reach it: its socket may have been removed
        return ControllerExit.HELD
    except FileNotFoundError:
        return ControllerExit.GONE  # deleted meanwhile
    except LostClaim as lost:
        print(f"hotswap: {lost}; this controller stops and leaves the workers alone", file=sys.stderr)
        return ControllerExit.GONE
    except HotswapError as error:
        print(f"hotswap: {error}", file=sys.stderr)
        return ControllerExit.FAILED
    except Exception as error:
        if not faults.is_fault(error):
            raise
        print(f"hotswap: {faults.explain(error)}", file=sys.stderr)
        return ControllerExit.FAILED
    return ControllerExit.STOPPED


if __name__ == "__main__":
    sys.exit(main())
