"""``hotswap controller run|manifests``: a cluster's controller in the foreground, and the
manifests that run a Kubernetes cluster's controller inside that cluster."""

from __future__ import annotations

import os

import typer

app = typer.Typer(help="Run a cluster's controller.", no_args_is_help=True)

# Set by the Deployment of `controller manifests`: the in-cluster controller has no local record.
IN_CLUSTER_SETTINGS = "HOTSWAP_KUBERNETES_SETTINGS"


@app.command("run")
def run(cluster: str = typer.Option(..., "--cluster", help="Cluster name.")) -> None:
    """Run the controller in the foreground (the CLI otherwise starts it in the background)."""
    from hotswap.api.errors import ConflictError
    from hotswap.backends.local import client, operations
    from hotswap.runtime.local_controller import AlreadyRunning, LocalController

    if os.environ.get(IN_CLUSTER_SETTINGS):
        import json

        from hotswap.runtime.kube_controller import run_kubernetes_controller

        run_kubernetes_controller(cluster, json.loads(os.environ[IN_CLUSTER_SETTINGS]))
        return

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


@app.command("manifests")
def manifests(
    cluster: str = typer.Option(..., "--cluster", help="A cluster created with --backend kubernetes."),
    image: str = typer.Option(..., "--image", help="An image with hotswap installed (pip install 'hotswap[kubernetes]')."),
) -> None:
    """Print the ServiceAccount, least-privilege RBAC and Deployment that run this cluster's
    controller inside it (apply with kubectl apply -f -)."""
    import sys

    import yaml

    from hotswap.backends.kubernetes.backend import settings_of
    from hotswap.backends.kubernetes.render import render_controller_manifests

    documents = render_controller_manifests(cluster, settings_of(cluster), image)
    sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False))
