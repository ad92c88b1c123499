"""What each request of a local cluster asks of its controller's next decision round.

:func:`round_inputs` reads a request row (its payload already checked by
``protocol.check_payload``) against the controller's snapshot and returns either the round's
inputs (the core's events, the workers on faulty nodes, new cluster settings) or the reason to
refuse it. Nothing here writes or signals anything: the controller commits the round, then acts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hotswap.api.errors import ConflictError, HotswapError
from hotswap.api.spec import workload_spec
from hotswap.backends.local.gpu.backing import SETTINGS_KEY, Backing
from hotswap.backends.local.protocol import NodeOperation, RequestKind
from hotswap.backends.local.resize import resize_events
from hotswap.core import events as ev
from hotswap.core.model import Snapshot
from hotswap.backends.local.tables import Request, WorkerRow
from hotswap.store.state import ClusterRecord

NODE_EVENTS: dict[NodeOperation, Callable[[str], ev.Event]] = {
    NodeOperation.FAIL: ev.NodeFailed,
    NodeOperation.DRAIN: ev.NodeDrained,
    NodeOperation.CORDON: ev.NodeCordoned,
    NodeOperation.UNCORDON: ev.NodeRepaired,
}


@dataclasses.dataclass(frozen=True)
class RoundInputs:
    events: list[ev.Event]
    hit: list[WorkerRow] = dataclasses.field(default_factory=list)  # workers on faulty nodes
    kill: bool = False  # ...killed at once (a failed node), else stopped gracefully (a drain)
    cluster: ClusterRecord | None = None  # new settings, which the round already decides with
    warm_workers: int | None = None  # after the commit: the new size of the warm pool...
    warm_preload: tuple[str, ...] | None = None  # ...and what its spares import
    zygote: bool | None = None  # after the commit: keep the cluster's zygote or not
    repaired: tuple[str, ...] = ()  # after the commit: nodes whose GPUs may be judged afresh


@dataclasses.dataclass(frozen=True)
class Refusal:
    message: str


def round_inputs(
    request: Request,
    kind: RequestKind,
    snapshot: Snapshot,
    cluster: ClusterRecord,
    workers_on: Callable[[set[str]], list[WorkerRow]],
) -> RoundInputs | Refusal:
    """The inputs of the round that serves ``request`` (not a shutdown), or why it is refused.
    ``workers_on(nodes)``: the live workers on those nodes."""
    payload: dict[str, Any] = request.payload or {}
    if kind is RequestKind.CREATE:
        try:
            return RoundInputs([ev.WorkloadCreated(workload_spec(**payload["spec"]))])
        except HotswapError as problem:
            return Refusal(f"refused: {problem}")
    if kind is RequestKind.DELETE:
        name = payload["workload"]
        if name not in snapshot.workloads:
            return Refusal(f"no workload named {name} in cluster {cluster.name}")
        return RoundInputs([ev.WorkloadDeleted(name)])
    if kind is RequestKind.NODE:
        operation, nodes = NodeOperation(payload["op"]), payload["nodes"]
        unknown = [n for n in nodes if n not in snapshot.nodes]
        if unknown:
            return Refusal(f"no node named {unknown[0]} in cluster {cluster.name}")
        evicted = operation in (NodeOperation.FAIL, NodeOperation.DRAIN)
        return RoundInputs(
            [NODE_EVENTS[operation](n) for n in nodes],
            hit=workers_on(set(nodes)) if evicted else [],
            kill=operation is NodeOperation.FAIL,
            repaired=tuple(nodes) if operation is NodeOperation.UNCORDON else (),
        )
    if kind is RequestKind.RESIZE:
        return _resize(payload, snapshot, cluster)
    raise ValueError(f"no round serves a {kind.value} request")


def _resize(payload: dict[str, Any], snapshot: Snapshot, cluster: ClusterRecord) -> RoundInputs | Refusal:
    events = resize_events(snapshot, cluster, payload["num_slices"])
    settings: dict[str, Any] = {}
    backing = Backing.of(cluster.settings)
    if backing is not None:
        try:  # checked before anything changes; recorded with the round, before a worker needs it
            settings[SETTINGS_KEY] = backing.after_resize(events, payload.get("gpus")).to_settings()
        except ConflictError as error:
            return Refusal(error.message)
    warm_workers = payload.get("warm_workers")
    preload = payload.get("warm_preload") if warm_workers is not None else None
    if warm_workers is not None:
        settings["warm_workers"] = warm_workers
        if preload is not None:
            settings["warm_preload"] = preload
    if "hotswap" in payload:
        settings["hotswap"] = payload["hotswap"]
    if "zygote" in payload:
        settings["zygote"] = payload["zygote"]
    return RoundInputs(
        events,
        cluster=dataclasses.replace(cluster, settings={**cluster.settings, **settings}),
        warm_workers=warm_workers,
        warm_preload=None if preload is None else tuple(preload),
        zygote=payload.get("zygote"),
    )
