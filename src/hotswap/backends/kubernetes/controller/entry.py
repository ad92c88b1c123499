"""``hotswap controller run`` for a Kubernetes cluster: connect, serve metrics, then run the
controller's loop (:mod:`~hotswap.backends.kubernetes.controller.loop`) until a signal ends it."""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Any

from hotswap.api.errors import HotswapError
from hotswap.backends.kit.metrics import ControllerMetrics
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.client import KubeClient
from hotswap.backends.kubernetes.controller.leader import log_line
from hotswap.backends.kubernetes.controller.loop import KubeController
from hotswap.backends.kubernetes.settings import KubeSettings


def settings_for(cluster: str, settings: dict[str, Any] | None) -> KubeSettings:
    if settings is not None:
        return KubeSettings.from_options(settings)
    from hotswap.backends.kubernetes.backend import settings_of

    return settings_of(cluster)


def run_kubernetes_controller(cluster: str, settings: dict[str, Any] | None = None, metrics_address: str | None = None) -> None:
    """Run the controller of a Kubernetes cluster in the foreground until SIGTERM or Ctrl-C."""
    resolved = settings_for(cluster, settings)
    client = KubeClient.connect(resolved)
    identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    metrics = ControllerMetrics()
    where = ""
    if metrics_address:
        host, port = metrics.serve(metrics_address)
        where = f"; metrics on http://{host}:{port}/metrics"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log_line(
        f"hotswap controller for cluster {cluster}: {client.host}, namespace {resolved.namespace}"
        + (", Kueue admits" if resolved.kueue else "")
        + f"; identity {identity}{where}"
    )
    try:
        client.require_apis(labels.JOBSET_API_VERSION, *([labels.KUEUE_API_VERSION] if resolved.kueue else []))
    except HotswapError as error:
        log_line(f"warning: {error}; the controller keeps trying")
    try:
        KubeController(client, cluster, metrics=metrics).run(stop, identity)
    except KeyboardInterrupt:
        stop.set()  # the Lease was released on the way out
    finally:
        metrics.close()
