"""``hotswap controller run|manifests``: a cluster's controller in the foreground, and the
manifests that run a Kubernetes cluster's controller inside that cluster."""

from __future__ import annotations

import os

import typer

app = typer.Typer(help="Run a cluster's controller.", no_args_is_help=True)

# Set by the Deployment of `controller manifests`: the in-cluster controller has no local record.
IN_CLUSTER_SETTINGS = "HOTSWAP_KUBERNETES_SETTINGS"


DEFAULT_METRICS_ADDRESS = "127.0.0.1:8080"


@app.command("run")
def run(
    cluster: str = typer.Option(..., "--cluster", help="Cluster name."),
    metrics_address: str | None = typer.Option(
        None, "--metrics-address",
        help=f"Serve Prometheus metrics on HOST:PORT (Kubernetes: default {DEFAULT_METRICS_ADDRESS}, \"\" turns them off; local: off unless given).",
    ),
) -> None:
    """Run the controller in the foreground (the CLI otherwise starts it in the background)."""
    import json

    from hotswap.cli.backends import for_controller, run_controller

    in_cluster = os.environ.get(IN_CLUSTER_SETTINGS)
    chosen = for_controller(cluster, in_cluster=bool(in_cluster))
    default = DEFAULT_METRICS_ADDRESS if chosen.capabilities.metrics_by_default else None
    address = default if metrics_address is None else metrics_address
    if address:
        _check_address(address)
    run_controller(chosen, cluster, json.loads(in_cluster) if in_cluster else None, address or None)


def _check_address(address: str) -> None:
    from hotswap.api.errors import InvalidInputError
    from hotswap.backends.kit.metrics import parse_address

    try:
        parse_address(address)
    except ValueError as error:
        raise InvalidInputError(f"--metrics-address: {error}") from None


@app.command("manifests")
def manifests(
    cluster: str = typer.Option(..., "--cluster", help="A cluster created with --backend kubernetes."),
    image: str = typer.Option(..., "--image", help="An image with hotswap installed (pip install 'hotswap[kubernetes]')."),
) -> None:
    """Print the ServiceAccount, least-privilege RBAC and Deployment that run this cluster's
    controller inside it (apply with kubectl apply -f -)."""
    import sys

    import yaml

    from hotswap.cli.backends import kubernetes_controller_manifests

    documents = kubernetes_controller_manifests(cluster, image)
    sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False))
