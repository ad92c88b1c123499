"""``hotswap controller run``: a cluster's controller in the foreground."""

from __future__ import annotations

import typer

app = typer.Typer(help="Run a cluster's controller.", no_args_is_help=True)


@app.command("run")
def run(cluster: str = typer.Option(..., "--cluster", help="Cluster name.")) -> None:
    """Run the controller in the foreground (the CLI otherwise starts it in the background)."""
    from hotswap.api.errors import ConflictError
    from hotswap.backends.local import client, operations
    from hotswap.runtime.local_controller import AlreadyRunning, LocalController

    paths = operations.existing(cluster)
    record = operations.record_of(paths)
    if record.backend == "kubernetes":
        from hotswap.runtime.kube_controller import run_kubernetes_controller

        run_kubernetes_controller(cluster)
        return
    try:
        LocalController(paths).run()
    except AlreadyRunning:
        raise ConflictError(
            f"the controller of cluster {cluster} is already running (pid {client.controller_pid(paths)})"
        ) from None
