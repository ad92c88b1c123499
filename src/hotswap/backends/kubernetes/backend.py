"""The Kubernetes backend behind the CLI's :class:`~hotswap.backends.base.Backend` interface.

The cluster record (``$HOTSWAP_HOME/clusters/<name>/state.db``) keeps only how to reach the
cluster (context, namespace, Kueue, label keys) and what ``cluster create`` found; everything
else is read live from the API server.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from typing import Any

from hotswap.api import worker as contract
from hotswap.api.catalog import get_device_type
from hotswap.api.launch import Launch
from hotswap.api.limits import check_text
from hotswap.api.errors import CapacityError, ConflictError, InvalidInputError, NotFoundError, never_fits
from hotswap.api.spec import WorkloadSpec
from hotswap.api.worker_report import heartbeat_interval
from hotswap.backends.features import Feature, require
from hotswap.backends.kubernetes import failed_runs, labels, log_archive
from hotswap.backends.kubernetes.checkpoint_volume import checkpoint_dir, parse_checkpoint_volume, run_directory
from hotswap.backends.kubernetes.clusters import BACKEND, cluster_summary, create_cluster
from hotswap.backends.kubernetes.discovery import discover
from hotswap.backends.kubernetes.client.connection import ForbiddenError
from hotswap.backends.kubernetes.live_objects import LiveJobSet, container_of, read_jobset, read_pod, worker_env_value
from hotswap.backends.kubernetes.render import render_image_cache, render_jobset
from hotswap.backends.kubernetes.settings import KubeSettings
from hotswap.backends.kubernetes.render.reports import report_access, report_leases
from hotswap.backends.kubernetes.worker_reports import goodput_view, progress_view, reports_by_workload
from hotswap.backends.kubernetes.views import (
    kueue_status,
    placement_view,
    slice_holders,
    timeline_view,
    view_of,
    workers_view,
)
from hotswap.backends.views import (
    FINISHED,
    CacheImageResult,
    ClusterCreated,
    ClusterDescription,
    NodeRow,
    SliceView,
    WorkloadDescription,
    WorkloadRow,
    matches,
)
from hotswap.backends.requests import ClusterRequest, PreparedWorkload, WorkloadRequest, new_run, spec_of
from hotswap.store import registry
from hotswap.store.paths import ClusterPaths
from hotswap.store.state import ClusterRecord

NODE_OPERATIONS = ("cordon", "uncordon", "drain")

# Its workers are pods on the nodes a cluster has: it provisions no node pools and runs nothing
# on this machine.
UNSUPPORTED_FEATURES = {
    Feature.NODE_POOLS: "{asked}: hotswap creates no node pools; create them with gcloud or xpk, then run"
    " `hotswap cluster create --backend kubernetes` to find their slices",
    Feature.MACHINE_DEVICE_TYPES: "{asked} is a local-only device type (GPUs of this machine); use it with --backend local",
    Feature.MACHINE_PROCESSES: "{asked}: not an option of --backend kubernetes",
}


def settings_of(cluster: str) -> KubeSettings:
    found = registry.find(cluster)
    if found is None:
        raise NotFoundError(
            f"no cluster named {cluster}: create it with `hotswap cluster create --backend kubernetes --cluster {cluster}`"
        )
    if found.backend != BACKEND:
        raise ConflictError(f"cluster {cluster} uses the {found.backend} backend, not kubernetes")
    return KubeSettings.from_options(found.settings)


def _volume(launch: Launch):
    return parse_checkpoint_volume(launch.checkpoint_volume) if launch.checkpoint_volume else None


class KubernetesBackend:
    name = BACKEND
    unsupported_features = UNSUPPORTED_FEATURES
    dashboard_interval_s = 2.0  # a look is a round of API server reads
    metrics_by_default = True  # in a cluster, Prometheus scrapes the controller

    def _client(self, settings: KubeSettings):
        from hotswap.backends.kubernetes.client import KubeClient

        return KubeClient.connect(settings)

    # ------------------------------------------------------------------ clusters

    def create_cluster(self, request: ClusterRequest, confirm: Callable[[str], bool]) -> ClusterCreated:
        """Record a Kubernetes cluster (see :func:`~hotswap.backends.kubernetes.clusters.create_cluster`)."""
        require(self.unsupported_features, request.features())
        return create_cluster(self._client, request.cluster, request.device_type, request.num_slices, request.api_server_settings())

    def delete_cluster(self, cluster: str, confirm: Callable[[str], bool]) -> None:
        """Forget the cluster: its record goes; nothing in the Kubernetes cluster is touched (so
        there is nothing to confirm)."""
        settings_of(cluster)
        shutil.rmtree(ClusterPaths.of(cluster).root, ignore_errors=True)

    def cache_image(self, cluster: str, image: str) -> CacheImageResult:
        settings = settings_of(cluster)
        client = self._client(settings)
        discovery = discover(client.list_nodes(), settings)
        types = sorted({s.device_type for s in discovery.slices}) or [registry.record_of(cluster).device_type]
        manifest = render_image_cache(cluster, image, [get_device_type(t) for t in types], settings)
        client.apply(manifest)
        name = manifest["metadata"]["name"]
        return {
            "cluster": cluster,
            "image": image,
            "applied": [manifest],
            "message": f"DaemonSet {settings.namespace}/{name} pulls {image} onto the nodes of every {', '.join(types)} slice"
            f" (watch it with `kubectl rollout status daemonset/{name} -n {settings.namespace}`)",
        }

    def describe_cluster(self, cluster: str) -> ClusterDescription:
        found = registry.find(cluster)
        settings = settings_of(cluster)
        client = self._client(settings)
        discovery = discover(client.list_nodes(), settings)
        views = [view_of(read_jobset(obj), {}) for obj in client.list_jobsets(cluster)]
        holders = slice_holders(views)
        summary = cluster_summary(cluster, found.device_type if found else "", settings, discovery)
        slices: list[SliceView] = [
            {
                "name": s.name,
                "device_type": s.device_type,
                "workload": holders.get(s.name),
                "healthy": discovery.healthy(s.name),
                "nodes": [{"name": n, "state": discovery.nodes[n].state.value} for n in s.nodes],
            }
            for s in discovery.slices
        ]
        workloads = [{"name": v["name"], "status": v["status"], "slices": v["slices"]} for v in views]
        return ClusterDescription(**summary, slices=slices, workloads=workloads, api_server=client.host)

    # ------------------------------------------------------------------ workloads

    def prepare_workload(self, request: WorkloadRequest, record: ClusterRecord | None) -> PreparedWorkload:
        """A request as pods run it: paths are inside their containers, XLA dumps are copied to a
        gs:// bucket, the image is used, checkpoints persist on the workload's volume (or the
        cluster's default). Changes nothing; a dry run renders for the cluster named, recorded
        or not (a JobSet carries its cluster's name)."""
        require(self.unsupported_features, request.features())
        spec = spec_of(request, record, debug_dump_gcs=_dump_bucket(request.debug_dump()))
        run = new_run(request.resume_from, request.fresh)
        settings = KubeSettings.from_options(record.settings) if record is not None else KubeSettings()
        volume = check_text("--checkpoint-volume", request.checkpoint_volume) if request.checkpoint_volume is not None else None
        volume = volume or settings.checkpoint_volume
        root = checkpoint_dir(spec, request.cluster, parse_checkpoint_volume(volume) if volume else None)
        launch = Launch(environ={}, cwd="", checkpoint_dir=run_directory(root, run) if root else "", run=run, checkpoint_volume=volume)
        return PreparedWorkload(spec=spec, launch=launch, dry_run_cluster=request.cluster)

    def dry_run(self, cluster: str | None, spec: WorkloadSpec, launch: Launch) -> Any:
        """The JobSet ``workload create`` would apply; no API server is needed, so its
        HOTSWAP_FAILED_RUNS names the failed runs this machine knows, not the cluster's record's."""
        name = cluster or "cluster"
        found = registry.find(name) if cluster else None
        settings = KubeSettings.from_options(found.settings) if found and found.backend == BACKEND else KubeSettings()
        failed = log_archive.failed_runs(name, spec.name) if found else ()
        return render_jobset(spec, name, settings, _volume(launch), launch.run, failed)

    def create_workload(self, cluster: str, spec: WorkloadSpec, launch: Launch) -> WorkloadRow:
        settings = settings_of(cluster)
        client = self._client(settings)
        manifest = render_jobset(spec, cluster, settings, _volume(launch), launch.run, failed_runs.known(client, cluster, spec.name))
        counts = discover(client.list_nodes(), settings).slices_by_type()
        never = never_fits(spec.num_slices, spec.device_type, counts.get(spec.device_type, 0))
        if never is not None:
            raise CapacityError(f"workload {spec.name} rejected: {never}")
        if client.get_jobset(spec.name) is not None:
            raise ConflictError(f"a workload named {spec.name} already exists in namespace {settings.namespace}")
        interval = heartbeat_interval(sum(counts.values()))  # the cluster's slices bound the replicas that write
        return view_of(read_jobset(_apply_with_reports(client, spec, settings.namespace, manifest, interval)), {})

    def delete_workload(self, cluster: str, name: str) -> None:
        """Delete the JobSet, first keeping its workers' log tails (see :mod:`.log_archive`)
        and, if its run failed, the cluster's record of it (see :mod:`.failed_runs`)."""
        settings = settings_of(cluster)
        client = self._client(settings)
        obj = client.get_jobset(name)
        if obj is None:
            raise NotFoundError(f"no workload named {name} in cluster {cluster}")
        job = read_jobset(obj)
        view = view_of(job, {})
        failed = failed_runs.entries_of([job], time.time())
        if failed:  # before the JobSet goes: a controller that has not seen it fail never will
            failed_runs.write(client, cluster, failed)
        if view["run_id"]:
            pods = [p for p in (read_pod(o) for o in client.list_pods(f"{labels.JOBSET_NAME_LABEL}={name}")) if p is not None]
            log_archive.archive(client, cluster, name, view["run_id"], log_archive.current_pods(pods), view["status"])
        client.delete_jobset(name)

    def workload_gone(self, cluster: str, name: str) -> bool:
        client = self._client(settings_of(cluster))
        # The JobSet is deleted in the background; its pods end after their grace period.
        return client.get_jobset(name) is None and not client.list_pods(f"{labels.JOBSET_NAME_LABEL}={name}")

    def _kueue(self, client: Any, settings: KubeSettings) -> dict[str, tuple[str, str]]:
        return kueue_status(client.list_kueue_workloads()) if settings.kueue else {}

    def list_workloads(self, cluster: str, status: str, job_filter: str | None) -> list[WorkloadRow]:
        settings = settings_of(cluster)
        client = self._client(settings)
        kueue = self._kueue(client, settings)
        views = [view_of(read_jobset(obj), kueue) for obj in client.list_jobsets(cluster)]
        return [v for v in views if matches(v, status, job_filter)]

    def describe_workload(self, cluster: str, name: str) -> WorkloadDescription:
        settings = settings_of(cluster)
        client = self._client(settings)
        obj = client.get_jobset(name)
        if obj is None:
            raise NotFoundError(f"no workload named {name} in cluster {cluster}")
        job = read_jobset(obj)
        view: WorkloadDescription = view_of(job, self._kueue(client, settings))  # its row, described below
        spec = job.spec
        view["spec"] = spec.model_dump(mode="json") if spec else {}
        # What the workers were given (their own --checkpoint-volume, or the cluster's default).
        given = worker_env_value(obj, contract.HOTSWAP_CHECKPOINT_DIR)
        view["checkpoint_dir"] = given or "none (no --checkpoint-volume)"
        view["workdir"] = None
        discovery = discover(client.list_nodes(), settings)
        pods = [p for p in (read_pod(o) for o in client.list_pods(f"{labels.JOBSET_NAME_LABEL}={name}")) if p is not None]
        view["placement"] = placement_view(job.replicas or view["slices"], discovery)
        view["workers"] = workers_view(pods, discovery, view["attempt"])
        view["logs"] = f"hotswap workload logs --cluster {cluster} --workload {name}"
        view["main_log"] = view["logs"]
        try:
            view["timeline"] = timeline_view(client.list_events("JobSet", name), job.uid)
        except ForbiddenError as error:  # describe still shows the rest to who may not read Events
            view["timeline"] = [{"time": None, "event": "(not readable)", "message": error.message}]
        try:
            reports = reports_by_workload(client.list_report_leases(name)).get(name, {})
        except ForbiddenError:
            reports = {}
        view["goodput"] = goodput_view(job, reports, time.time())
        view["progress"] = progress_view(job.record.failures if job.record is not None else (), reports)
        return view

    def logs(
        self, cluster: str, name: str, slice_: str | None, host: int, follow: bool, write: Callable[[bytes], None]
    ) -> str | None:
        settings = settings_of(cluster)
        client = self._client(settings)
        obj = client.get_jobset(name)
        if obj is None:
            return _archived_log(cluster, name, slice_, host, write)
        job = read_jobset(obj)
        replicas = job.replicas
        num = job.spec.num_slices if job.spec else len(replicas)
        replica = 0
        if slice_ is not None:
            if slice_.isdigit():
                replica = int(slice_)
            elif slice_ in replicas:
                replica = replicas.index(slice_)
            else:
                raise NotFoundError(f"workload {name} does not run on slice {slice_}; give a replica index (0-{num - 1})")
        if not 0 <= replica < max(num, 1):
            raise NotFoundError(f"workload {name} has replicas 0-{num - 1}, not {replica}")
        pods = [p for p in (read_pod(o) for o in client.list_pods(f"{labels.JOBSET_NAME_LABEL}={name},{labels.JOB_INDEX_LABEL}={replica}")) if p is not None]
        pod = next((p for p in pods if p.host == host and not p.terminating), None) or next((p for p in pods if p.host == host), None)
        if pod is None:
            view = view_of(job, {})
            why = (
                "it is QUEUED and has not started yet" if view["status"] == "QUEUED" and not view["attempt"]
                else f"it never started ({view['status']}: {view['status_message']})" if view["status"] in FINISHED and not view["attempt"]
                else f"its pods are gone or not created yet ({view['status']})"
            )
            raise NotFoundError(f"workload {name} has no log of replica {replica} host {host}: {why}")
        for chunk in client.pod_log(pod.name, follow, container_of(pod.annotations)):
            write(chunk)
        return None

    # ------------------------------------------------------------------ nodes

    def list_nodes(self, cluster: str) -> list[NodeRow]:
        settings = settings_of(cluster)
        client = self._client(settings)
        discovery = discover(client.list_nodes(), settings)
        holders = slice_holders([view_of(read_jobset(obj), {}) for obj in client.list_jobsets(cluster)])
        return [
            {"name": n.name, "slice": n.slice, "host": n.host, "state": n.state.value, "workload": holders.get(n.slice)}
            for n in sorted(discovery.nodes.values(), key=lambda n: (n.slice, n.host))
            if not n.placeholder
        ]

    def node_operation(self, cluster: str, operation: str, node: str | None, slice_: str | None) -> list[str]:
        """``cordon``/``uncordon``/``drain`` as kubectl does them (drain evicts through the
        Eviction API). Hardware faults cannot be injected into a real cluster."""
        if operation == "fail":
            raise InvalidInputError(
                "`node fail` injects a hardware fault on the local backend only; on Kubernetes rehearse with"
                " `hotswap node drain` or `hotswap node cordon`"
            )
        if operation not in NODE_OPERATIONS:
            raise InvalidInputError(f"unknown node operation {operation!r}")
        if (node is None) == (slice_ is None):
            raise InvalidInputError("give exactly one of --node or --slice")
        settings = settings_of(cluster)
        client = self._client(settings)
        discovery = discover(client.list_nodes(), settings)
        real = [n for n in discovery.nodes.values() if not n.placeholder]
        if node is not None:
            targets = [n.name for n in real if n.name == node]
            if not targets:
                raise NotFoundError(f"no node named {node} in cluster {cluster} (see `hotswap node list --cluster {cluster}`)")
        else:
            targets = sorted(n.name for n in real if n.slice == slice_)
            if not targets:
                raise NotFoundError(f"no slice named {slice_} in cluster {cluster} (see `hotswap cluster describe --cluster {cluster}`)")
        for name in targets:
            client.set_unschedulable(name, operation != "uncordon")
        if operation == "drain":
            for name in targets:
                for pod in client.list_pods_on_node(name):
                    meta = pod.get("metadata") or {}
                    owners = meta.get("ownerReferences") or []
                    if meta.get("namespace") != settings.namespace or any(o.get("kind") == "DaemonSet" for o in owners):
                        continue  # like kubectl drain --ignore-daemonsets, and only hotswap's namespace
                    with contextlib.suppress(NotFoundError):
                        client.evict(meta["name"])
        return targets


def _dump_bucket(location: str | None) -> str | None:
    """--debug-dump-gcs: a gs:// path the pods copy their XLA dumps to (with gsutil, as xpk's do)."""
    if location is not None and (not location.startswith("gs://") or len(location) <= len("gs://")):
        raise InvalidInputError(f"--debug-dump-gcs {location}: on Kubernetes give a gs://bucket[/path] for the pods to copy to")
    return location


def _archived_log(cluster: str, name: str, slice_: str | None, host: int, write: Callable[[bytes], None]) -> str:
    """The log a deleted workload's worker left in the archive; the note says so."""
    kept = log_archive.newest(cluster, name)
    if kept is None:
        raise NotFoundError(f"no workload named {name} in cluster {cluster}")
    if slice_ is not None and not slice_.isdigit():
        raise NotFoundError(f"workload {name} was deleted: give its replica index with --slice, not a slice name")
    replica = int(slice_ or 0)
    path = kept.log_of(replica, host)
    if path is None:
        why = kept.unreadable(replica, host)
        detail = f": {why}" if why else ": it had no such worker"
        raise NotFoundError(f"workload {name} was deleted and no log of replica {replica} host {host} was kept{detail}")
    write(path.read_bytes())
    return (
        f"workload {name} was deleted: this is the log of replica {replica} host {host} of run"
        f" {kept.index['run_id']}, kept at its deletion ({kept.index['archived_at']})"
    )


def _existing_jobset(client: Any, cluster: str, name: str) -> LiveJobSet:
    """The workload's JobSet, or the same one-line error as the local backend gives."""
    obj = client.get_jobset(name)
    if obj is None:
        raise NotFoundError(f"no workload named {name} in cluster {cluster}")
    return read_jobset(obj)


def _apply_with_reports(client: Any, spec: WorkloadSpec, namespace: str, manifest: dict[str, Any], interval_s: float) -> dict[str, Any]:
    """Apply the JobSet with what its workers need to write their records (render/reports.py):
    its pods run as the workload's ServiceAccount, so that exists before them; then everything
    owned by the JobSet. Returns the JobSet applied."""
    try:
        default_account = client.get_service_account("default")
    except ForbiddenError:
        default_account = None
    for obj in report_access(spec, namespace, default_account):
        client.apply(obj)
    applied: dict[str, Any] = client.apply(manifest)
    for obj in report_access(spec, namespace, default_account, owner=applied) + report_leases(spec, namespace, applied, interval_s):
        client.apply(obj)
    return applied
