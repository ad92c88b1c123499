"""What every backend shows the same way: the documents its methods return (typed views), the
``workload list`` filters and table, and times.

The rows are the JSON contract of DESIGN.md (``name``, ``priority``, ``status``,
``status_message``, ``status_time``, ``created_time``, ``slices``, ``num_slices``, ``restarts``,
``preemptions``); each backend builds them from its own state, and :func:`hotswap.api.xpk_status.with_xpk_words` adds
xpk's ``xpk_status`` / ``xpk_status_message`` and hotswap's ``hotswap_state`` (the contract only
grows).

The views are typed dicts (:class:`~typing.TypedDict`), not classes of their own, so that the CLI prints
them as the JSON it always has, key for key and in the same order. Keys one backend alone gives
are not required (``total=False``) and say which backend gives them.
"""

from __future__ import annotations

from typing import Any, TypedDict, Union

from hotswap.api import xpk_status as xpk
from hotswap.api.times import iso_utc
from hotswap.api.xpk_status import with_xpk_words

FINISHED = ("SUCCESSFUL", "FAILED")
STATUS_FILTERS = xpk.STATUS_FILTERS
# xpk's columns in xpk's order (its VM counts are slices here), then hotswap's own state.
TABLE_COLUMNS = [
    "Name",
    "Created Time",
    "Priority",
    "Slices Needed",
    "Slices Running/Ran",
    "Slices Done",
    "Status",
    "Status Message",
    "Status Time",
    "Hotswap State",
]
# On a narrow terminal, the columns left out first (Name and Status always stay).
TABLE_HIDE_ORDER = [
    "Created Time", "Slices Done", "Slices Needed", "Status Time", "Priority", "Slices Running/Ran",
    "Hotswap State", "Status Message",
]


def iso(t: float | None) -> str | None:
    """UTC time as ISO 8601, like xpk's table (``2026-11-22T12:00:00Z``)."""
    if not t:
        return None  # never set (a real time is never the epoch)
    return iso_utc(t)


def matches(view: WorkloadRow, status: str, job_filter: str | None) -> bool:
    """xpk's filters, ``--filter-by-status`` and ``--filter-by-job`` (names containing it)."""
    return xpk.matches(view["status"], view["status_message"] or "", len(view["slices"]), view["name"], status, job_filter)


def table_row(view: WorkloadRow) -> list[str]:
    """One row of the ``workload list`` table: xpk's columns in xpk's order, then hotswap's state."""
    view = with_xpk_words(view)
    held = len(view["slices"])
    done = view["num_slices"] if view["status"] == "SUCCESSFUL" else None
    return [
        view["name"],
        view["created_time"] or "<none>",
        view["priority"],
        str(view["num_slices"]) if view.get("num_slices") is not None else "<none>",
        str(held) if held else "<none>",
        str(done) if done is not None else "<none>",
        view["xpk_status"],
        view["xpk_status_message"] or "<none>",
        view["status_time"] or "<none>",
        view["hotswap_state"],
    ]


# ---------------------------------------------------------------------- workloads


class _WorkloadRowRequired(TypedDict):
    name: str
    priority: str
    status: str
    status_message: str | None
    status_time: str | None
    created_time: str | None
    slices: list[str]
    num_slices: int | None
    min_slices: int | None
    device_type: str | None
    restarts: int
    preemptions: int
    disruptions: int
    attempt: int
    command: str | None
    xpk_status: str
    xpk_status_message: str | None
    hotswap_state: str


class WorkloadRow(_WorkloadRowRequired, total=False):
    """One row of ``workload list --output json`` (``Backend.list_workloads``)."""

    run_id: str | None  # in every row listed; None for a workload of a release without runs
    resumed_from: dict[str, Any] | None  # where the run's state came from (``run_origin``)
    not_resumed: dict[str, Any]  # only when a predecessor's checkpoint was passed over: run, path, reason


class NodeState(TypedDict, total=False):
    name: str
    state: str | None
    reason: str | None  # local: why a node is not Ready


class PlacementRow(TypedDict):
    replica: int
    slice: str
    nodes: list[NodeState]


class WorkerView(TypedDict):
    attempt: int
    replica: int | None
    host: int | None
    slice: str | None
    pid: int | str | None  # Kubernetes: the pod's name
    state: str
    exit_code: int | None


class TimelineEntry(TypedDict):
    time: str | None
    event: str
    message: str


class _GoodputRequired(TypedDict):
    goodput: float | None  # None: unknown, no step was reported (``reason`` says why)
    wall_s: float
    source: str
    badput: dict[str, float]


class GoodputView(_GoodputRequired, total=False):
    slice_seconds: dict[str, float]  # local
    reason: str  # why goodput is unknown: no step was reported by the workers
    running_share: float  # when unknown: the share of time the workers were up (not goodput: no step seen)


class _WorkloadDescribed(WorkloadRow):
    spec: dict[str, Any]
    checkpoint_dir: str
    workdir: str | None
    placement: list[PlacementRow]
    workers: list[WorkerView]
    logs: str
    main_log: str


class WorkloadDescription(_WorkloadDescribed, total=False):
    """``workload describe --output json`` (``Backend.describe_workload``): always with its
    timeline and goodput; the local backend's ``create_workload`` leaves those two out."""

    timeline: list[TimelineEntry]
    goodput: GoodputView
    # The local backend's: recoveries and MTTR, restores, latest steps, exact timeline times
    # (``backends/local/queries/progress.py``), from the records.
    progress: dict[str, Any]


class WorkloadVanished(TypedDict):
    """A workload created, then deleted by another command before it could be described."""

    name: str
    status: str
    status_message: str


# What ``Backend.create_workload`` returns (``workload create --output json``).
WorkloadCreated = Union[WorkloadRow, WorkloadDescription, WorkloadVanished]


# ---------------------------------------------------------------------- clusters and nodes


class GpuView(TypedDict):
    index: int
    uuid: str
    name: str


class _NodeRowRequired(TypedDict):
    name: str
    slice: str
    host: int
    state: str
    workload: str | None


class NodeRow(_NodeRowRequired, total=False):
    """One row of ``node list --output json`` (``Backend.list_nodes``)."""

    reason: str | None  # local
    gpus: list[GpuView]  # local


class _SliceViewRequired(TypedDict):
    name: str
    device_type: str
    workload: str | None
    healthy: bool
    nodes: list[NodeState]


class SliceView(_SliceViewRequired, total=False):
    gpus: list[GpuView]  # local


class SliceHolder(TypedDict):
    name: str
    status: str
    slices: list[str]


class GpuHealth(TypedDict):
    time: str | None
    message: str


class _ClusterSummaryRequired(TypedDict):
    name: str
    backend: str
    device_type: str
    hosts_per_slice: int
    chips_per_host: int
    num_slices: int
    controller_pid: int | None


class ClusterSummary(_ClusterSummaryRequired, total=False):
    """What ``cluster create|describe`` print about a cluster, whichever backend."""

    # local
    created_time: float
    warm_workers: int
    zygote: bool  # a pre-imported process forks the workers that find no spare
    hotswap: bool
    backing: str  # "gpu" or "emulated"
    gpus_per_host: int
    gpu_health: GpuHealth | None
    state_dir: str
    # kubernetes
    slices_by_type: dict[str, int]
    context: str | None
    namespace: str
    kueue: bool
    api_server: str


class ClusterDescription(ClusterSummary):
    """``cluster describe --output json`` (``Backend.describe_cluster``)."""

    slices: list[SliceView]
    workloads: list[SliceHolder]


class ClusterCreated(ClusterSummary, total=False):
    """``cluster create --output json`` (``Backend.create_cluster``): the local backend's is its
    description; the Kubernetes backend's, the summary and what it found installed."""

    slices: list[SliceView]
    workloads: list[SliceHolder]
    installed: list[str]  # kubernetes


class CacheImageResult(TypedDict):
    """``cluster cacheimage --output json`` (``Backend.cache_image``)."""

    cluster: str
    image: str
    applied: list[dict[str, Any]]  # the manifests applied (none locally)
    message: str
