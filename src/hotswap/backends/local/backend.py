"""The local backend behind the CLI's :class:`~hotswap.backends.base.Backend` interface."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hotswap.api.catalog import get_device_type
from hotswap.api.errors import InvalidInputError, NotFoundError
from hotswap.api.launch import Launch
from hotswap.backends.features import Feature, require
from hotswap.backends.local.commands import client, clusters, nodes, workloads
from hotswap.backends.local.queries import clusters as cluster_queries
from hotswap.backends.local.queries import logs
from hotswap.backends.local.queries import nodes as node_queries
from hotswap.backends.local.queries import workloads as workload_queries
from hotswap.store.registry import existing
from hotswap.backends.views import (
    CacheImageResult,
    ClusterCreated,
    ClusterDescription,
    NodeRow,
    WorkloadCreated,
    WorkloadDescription,
    WorkloadRow,
)

if TYPE_CHECKING:  # pydantic loads only where specs are built or validated: reads stay fast
    from hotswap.api.spec import WorkloadSpec
    from hotswap.backends.requests import ClusterRequest, PreparedWorkload, WorkloadRequest
    from hotswap.store.state import ClusterRecord

# Its slices are processes of this machine, run where the user is: no API server, no
# containers, no node pools.
UNSUPPORTED_FEATURES = {
    Feature.NODE_POOLS: "{asked}: the local backend has no node pools (its slices are processes of this machine)",
    Feature.API_SERVER_SETTINGS: "{asked}: only for --backend kubernetes",
    Feature.CHECKPOINT_VOLUMES: "--checkpoint-volume is only for --backend kubernetes (use --checkpoint-dir)",
    Feature.CONTAINER_NAMES: "--docker-name names the workers' container on Kubernetes; the local backend runs processes, not containers",
}


class LocalBackend:
    name = "local"
    unsupported_features = UNSUPPORTED_FEATURES
    dashboard_interval_s = 0.5  # a look is a read of the cluster's database
    metrics_by_default = False

    def create_cluster(self, request: ClusterRequest, confirm: Callable[[str], bool]) -> ClusterCreated:
        require(self.unsupported_features, request.features())
        if request.device_type is None or (request.num_slices is None and request.gpus is None):
            raise InvalidInputError("a local cluster needs --device-type and --num-slices (or --gpus)")
        clusters.create_cluster(
            request.cluster, request.device_type, request.num_slices, request.force, confirm,
            warm_workers=request.warm_workers, gpus=request.gpus,
        )
        return cluster_queries.describe_cluster(request.cluster)

    def delete_cluster(self, cluster: str, confirm: Callable[[str], bool]) -> None:
        clusters.delete_cluster(cluster, confirm)

    def describe_cluster(self, cluster: str) -> ClusterDescription:
        self._keep_served(cluster)
        return cluster_queries.describe_cluster(cluster)

    def prepare_workload(self, request: WorkloadRequest, record: ClusterRecord | None) -> PreparedWorkload:
        require(self.unsupported_features, request.features())
        return workloads.prepare_workload(request, record)

    def create_workload(self, cluster: str, spec: WorkloadSpec, launch: Launch) -> WorkloadCreated:
        workloads.create_workload(cluster, spec, launch)
        try:
            return workload_queries.describe_workload(cluster, spec.name, timeline=False)
        except NotFoundError:  # created, then deleted by another command before we looked
            return {"name": spec.name, "status": "DELETED", "status_message": "created, then deleted by another command"}

    def dry_run(self, cluster: str | None, spec: WorkloadSpec, launch: Launch) -> Any:
        return {
            "spec": spec.model_dump(mode="json"),
            "cluster": cluster,
            "workdir": launch.cwd,
            "checkpoint_dir": launch.checkpoint_dir,
            "workers": spec.num_slices * get_device_type(spec.device_type).hosts_per_slice,
        }

    def delete_workload(self, cluster: str, name: str) -> None:
        workloads.delete_workload(cluster, name)

    def cache_image(self, cluster: str, image: str) -> CacheImageResult:
        existing(cluster)  # an unknown cluster is still an error
        return {
            "cluster": cluster,
            "image": image,
            "applied": [],
            "message": f"cluster {cluster} is local: its workers are processes of this machine, not containers,"
            " so there is no image to pull (nothing done)",
        }

    def workload_gone(self, cluster: str, name: str) -> bool:
        return workload_queries.workload_gone(cluster, name)

    def list_workloads(self, cluster: str, status: str, job_filter: str | None) -> list[WorkloadRow]:
        self._keep_served(cluster)
        return workload_queries.list_workloads(cluster, status, job_filter)

    def describe_workload(self, cluster: str, name: str) -> WorkloadDescription:
        return workload_queries.describe_workload(cluster, name)

    def logs(
        self, cluster: str, name: str, slice_: str | None, host: int, follow: bool, write: Callable[[bytes], None]
    ) -> None:
        path = logs.log_file(cluster, name, slice_, host, follow)
        position = 0
        idle_since = time.monotonic()
        while True:
            if path.exists():
                with open(path, "rb") as handle:
                    handle.seek(position)
                    chunk = handle.read()
                if chunk:
                    write(chunk)
                    position += len(chunk)
                    idle_since = time.monotonic()
            if not follow:
                return
            # Like tail -f: the log is a plain file written by another process. Stop once the
            # workload has finished and its log has been quiet for a second.
            if time.monotonic() - idle_since > 1.0 and self._finished(cluster, name):
                return
            time.sleep(0.2)

    @staticmethod
    def _finished(cluster: str, name: str) -> bool:
        views = {v["name"]: v["status"] for v in workload_queries.list_workloads(cluster, "EVERYTHING", None)}
        return views.get(name) in (None, "SUCCESSFUL", "FAILED")

    @staticmethod
    def _keep_served(cluster: str) -> None:
        """Before the user looks at a cluster: one whose controller died (killed, out of memory,
        a reboot) gets a new one, started in the background, which re-adopts its workers. The
        read itself is a query (``queries/``), which starts nothing and does not wait for it."""
        client.wake_controller(existing(cluster))

    def list_nodes(self, cluster: str) -> list[NodeRow]:
        self._keep_served(cluster)
        return node_queries.list_nodes(cluster)

    def node_operation(self, cluster: str, operation: str, node: str | None, slice_: str | None) -> list[str]:
        return nodes.node_operation(cluster, operation, node, slice_)
