"""What each request of a local cluster asks of its controller's next decision round.

:class:`RequestRounds` is the controller's :class:`~hotswap.backends.local.requests.RequestHandler`:
given a request (a typed record, parsed once when the controller took its row) and the
controller's :class:`~hotswap.backends.local.controller.state.ClusterState`, it returns the
round's inputs (the core's events, the workers on faulty nodes, new cluster settings) or the
reason to refuse the request; ``cluster delete`` is no round but a :class:`Deletion`. Nothing
here writes or signals anything: the controller commits the round, then acts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hotswap.api.errors import ConflictError
from hotswap.api.launch import Launch
from hotswap.backends.local.controller.state import ClusterState
from hotswap.backends.local.requests import (
    ChangeNodes,
    CreateWorkload,
    DeleteWorkload,
    NodeOperation,
    ResizeCluster,
    Shutdown,
)
from hotswap.backends.local.resize import resize_events
from hotswap.backends.local.settings import LocalSettings
from hotswap.backends.local.tables import WorkerRow
from hotswap.core import events as ev

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
    settings: LocalSettings | None = None  # new settings, which the round already decides with
    created: Launch | None = None  # a create's launch, stored with its workload (whose rejection answers it)
    warm_workers: int | None = None  # after the commit: the new size of the warm pool...
    warm_preload: tuple[str, ...] | None = None  # ...and what its spares import
    zygote: bool | None = None  # after the commit: keep the cluster's zygote or not
    repaired: tuple[str, ...] = ()  # after the commit: nodes whose GPUs may be judged afresh


@dataclasses.dataclass(frozen=True)
class Refusal:
    message: str


@dataclasses.dataclass(frozen=True)
class Deletion:
    """``cluster delete``: no round; the deletion is committed, then every worker is stopped."""


Asked = RoundInputs | Refusal | Deletion


class RequestRounds:
    """What each kind of request asks of the next round (see the module)."""

    def __init__(self, state: ClusterState, workers_on: Callable[[set[str]], list[WorkerRow]]) -> None:
        """``workers_on(nodes)``: the live workers on those nodes."""
        self.state = state
        self.workers_on = workers_on

    def on_create(self, request: CreateWorkload) -> Asked:
        return RoundInputs([ev.WorkloadCreated(request.spec)], created=request.launch)

    def on_delete(self, request: DeleteWorkload) -> Asked:
        if request.workload not in self.state.snapshot.workloads:
            return Refusal(f"no workload named {request.workload} in cluster {self.state.cluster.name}")
        return RoundInputs([ev.WorkloadDeleted(request.workload)])

    def on_node(self, request: ChangeNodes) -> Asked:
        operation, nodes = request.operation, request.nodes
        unknown = [n for n in nodes if n not in self.state.snapshot.nodes]
        if unknown:
            return Refusal(f"no node named {unknown[0]} in cluster {self.state.cluster.name}")
        evicted = operation in (NodeOperation.FAIL, NodeOperation.DRAIN)
        return RoundInputs(
            [NODE_EVENTS[operation](n) for n in nodes],
            hit=self.workers_on(set(nodes)) if evicted else [],
            kill=operation is NodeOperation.FAIL,
            repaired=tuple(nodes) if operation is NodeOperation.UNCORDON else (),
        )

    def on_resize(self, request: ResizeCluster) -> Asked:
        state = self.state
        events = resize_events(state.snapshot, state.cluster, request.num_slices)
        changes: dict[str, Any] = {}
        if state.backing is not None:
            try:  # checked before anything changes; recorded with the round, before a worker needs it
                changes["backing"] = state.backing.after_resize(events, request.gpus)
            except ConflictError as error:
                return Refusal(error.message)
        preload = request.warm_preload if request.warm_workers is not None else None
        if request.warm_workers is not None:
            changes["warm_workers"] = request.warm_workers
            if preload is not None:
                changes["warm_preload"] = preload
        if request.hotswap is not None:
            changes["hotswap"] = request.hotswap
        if request.zygote is not None:
            changes["zygote"] = request.zygote
        return RoundInputs(
            events,
            settings=dataclasses.replace(state.settings, **changes),
            warm_workers=request.warm_workers,
            warm_preload=preload,
            zygote=request.zygote,
        )

    def on_shutdown(self, request: Shutdown) -> Asked:
        return Deletion()
