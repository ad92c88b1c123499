"""What the CLI asks of a backend. The local backend and the Kubernetes backend both provide it,
so one CLI drives either; a cluster's record (in the state directory) says which one it uses.

The CLI parses a command's flags once into a backend-neutral request
(:mod:`hotswap.backends.requests`); the backend turns it into what it runs, answers for the
features it lacks with its own reasons (:mod:`hotswap.backends.features`), and raises its own
one-line :class:`~hotswap.api.errors.HotswapError` subclasses, before changing anything. Returned
data are the typed views of :mod:`hotswap.backends.views` (the JSON contracts of DESIGN.md:
``workload list`` rows, ``node list`` rows, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pydantic loads only where specs are built or validated: reads stay fast
    from hotswap.api.launch import Launch
    from hotswap.api.spec import WorkloadSpec
    from hotswap.backends.features import Feature
    from hotswap.backends.requests import ClusterRequest, PreparedWorkload, WorkloadRequest
    from hotswap.backends.views import (
        CacheImageResult,
        ClusterCreated,
        ClusterDescription,
        NodeRow,
        WorkloadCreated,
        WorkloadDescription,
        WorkloadRow,
    )
    from hotswap.store.state import ClusterRecord


class Backend(Protocol):
    name: str
    # What it cannot do, each feature with its reason in its own words (one line; see features.py).
    unsupported_features: Mapping[Feature, str]
    # Seconds between the dashboard's looks at a cluster, unless --interval says otherwise.
    dashboard_interval_s: float
    # Whether ``controller run`` serves Prometheus metrics unless told not to (else only when asked).
    metrics_by_default: bool

    def create_cluster(self, request: ClusterRequest, confirm: Callable[[str], bool]) -> ClusterCreated:
        """Create (or, re-run, resize/refresh) a cluster; ``confirm`` is asked before a shrink."""
        ...

    def delete_cluster(self, cluster: str, confirm: Callable[[str], bool]) -> None:
        """Delete a cluster; ``confirm`` is asked first when that stops unfinished work."""
        ...

    def describe_cluster(self, cluster: str) -> ClusterDescription: ...

    def cache_image(self, cluster: str, image: str) -> CacheImageResult:
        """``cluster cacheimage``: have ``image`` pulled on the cluster's nodes ahead of time;
        returns what was done (``message``, and the objects applied, if any)."""
        ...

    def prepare_workload(self, request: WorkloadRequest, record: ClusterRecord | None) -> PreparedWorkload:
        """Turn ``workload create``'s request into the spec and the launch of a new run, as this
        backend runs them (paths of this machine or of its pods, images used or recorded), for
        the cluster of ``record`` (None: a dry run for a cluster with no record). Changes nothing."""
        ...

    def create_workload(self, cluster: str, spec: WorkloadSpec, launch: Launch) -> WorkloadCreated: ...

    def dry_run(self, cluster: str | None, spec: WorkloadSpec, launch: Launch) -> Any:
        """What ``workload create`` would do, as a document to print; changes nothing. ``cluster``:
        the prepared workload's ``dry_run_cluster``."""
        ...

    def delete_workload(self, cluster: str, name: str) -> None: ...

    def workload_gone(self, cluster: str, name: str) -> bool:
        """Whether a deleted workload is wholly gone: no record left and none of its workers
        (or pods) still stopping (``workload delete --wait``)."""
        ...

    def list_workloads(self, cluster: str, status: str, job_filter: str | None) -> list[WorkloadRow]: ...

    def describe_workload(self, cluster: str, name: str) -> WorkloadDescription: ...

    def logs(
        self, cluster: str, name: str, slice_: str | None, host: int, follow: bool, write: Callable[[bytes], None]
    ) -> str | None:
        """Write one worker's log; return a note for stderr about where it came from, if any."""
        ...

    def list_nodes(self, cluster: str) -> list[NodeRow]: ...

    def node_operation(self, cluster: str, operation: str, node: str | None, slice_: str | None) -> list[str]: ...
