"""Small builders for readable scheduling scenarios: a cluster, workloads, events, and a
compact text form of actions ("preempt low by high", "restart high np-0,np-2"); and for the
capacity and placement tests, a round's capacity over a few named slices."""

from __future__ import annotations

import dataclasses
from typing import Any

from hotswap.api.catalog import get_device_type
from hotswap.api.cluster import NodeState, node_name, slice_name
from hotswap.api.phases import WorkloadPhase
from hotswap.api.spec import WorkloadSpec, workload_spec
from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.capacity import Capacity
from hotswap.core.model import Node, Slice, Snapshot
from hotswap.core.workload import Workload
from hotswap.core.policy import SchedulerConfig
from hotswap.core.scheduler import decide

CLUSTER = "c"


def spec(name: str, slices: int = 1, priority: str = "medium", device: str = "v6e-16", **more: Any) -> WorkloadSpec:
    return workload_spec(
        name=name, command="python train.py", device_type=device, num_slices=slices, priority=priority, **more
    )


def create(name: str, slices: int = 1, priority: str = "medium", **more: Any) -> ev.WorkloadCreated:
    return ev.WorkloadCreated(spec(name, slices, priority, **more))


def node(slice_index: int, host: int = 0) -> str:
    return node_name(slice_name(CLUSTER, slice_index), host)


def fail(slice_index: int, host: int = 0) -> ev.NodeFailed:
    return ev.NodeFailed(node(slice_index, host))


def cordon(slice_index: int, host: int = 0) -> ev.NodeCordoned:
    return ev.NodeCordoned(node(slice_index, host))


def drain(slice_index: int, host: int = 0) -> ev.NodeDrained:
    return ev.NodeDrained(node(slice_index, host))


def repair(slice_index: int, host: int = 0) -> ev.NodeRepaired:
    return ev.NodeRepaired(node(slice_index, host))


def short(name: str) -> str:
    return name.removeprefix(f"{CLUSTER}-")


def render(action: act.Action) -> str:
    """One action as compact text, slices by their short names."""
    def names(slices: tuple[str, ...]) -> str:
        return ",".join(short(s) for s in slices)

    match action:
        case act.Reject(workload=w):
            return f"reject {w}"
        case act.Admit(workload=w, slices=s, start=start):
            return f"admit {w} {names(s)}" + ("" if start else " (waiting)")
        case act.Preempt(workload=w, preemptor=p):
            return f"preempt {w} by {p}"
        case act.Restart(workload=w, slices=s, charged=charged, start=start):
            return f"restart {w} {names(s)}" + (" charged" if charged else "") + ("" if start else " (waiting)")
        case act.StartWorkers(workload=w, slices=s):
            return f"start {w} {names(s)}"
        case act.Requeue(workload=w):
            return f"requeue {w}"
        case act.ScaleDown(workload=w, removed=r):
            return f"scaledown {w} -{names(r)}"
        case act.ScaleUp(workload=w, added=a):
            return f"scaleup {w} +{names(a)}"
        case act.Fail(workload=w):
            return f"fail {w}"
        case act.Complete(workload=w):
            return f"complete {w}"
        case act.Remove(workload=w):
            return f"remove {w}"
    raise AssertionError(f"unknown action {action!r}")


@dataclasses.dataclass
class World:
    """A cluster of ``slices`` slices of ``device`` and a clock that ticks one second per step."""

    slices: int = 3
    device: str = "v6e-16"
    config: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    extra: tuple[tuple[str, int], ...] = ()  # more (device type, count) groups

    def __post_init__(self) -> None:
        self.now = 0.0
        self.snapshot = Snapshot.build()
        self.log: list[act.Action] = []
        groups = [(self.device, self.slices), *self.extra]
        index = 0
        added = []
        for device, count in groups:
            hosts = get_device_type(device).hosts_per_slice
            for _ in range(count):
                name = slice_name(CLUSTER, index)
                added.append(ev.SliceAdded(name, device, tuple(node_name(name, h) for h in range(hosts))))
                index += 1
        self.step(*added)

    def step(self, *events: ev.Event) -> list[str]:
        self.now += 1.0
        decision = decide(self.snapshot, events, self.now, self.config)
        self.snapshot = decision.snapshot
        self.snapshot.check()
        self.log.extend(decision.actions)
        self.last = decision.actions
        return [render(a) for a in decision.actions]

    def workload(self, name: str) -> Workload:
        return self.snapshot.workloads[name]

    def state(self, name: str) -> str:
        """``PHASE np-0,np-1`` for one workload."""
        w = self.workload(name)
        held = ",".join(short(s) for s in w.slices)
        return f"{w.phase.value} {held}".strip()

    def stop_all(self, name: str) -> list[str]:
        """Report that every stopping attempt of a workload has exited."""
        w = self.workload(name)
        return self.step(*(ev.WorkersStopped(name, a) for a in sorted(w.stopping)))

    def exit(self, name: str, code: int, slice_index: int | None = None, host: int = 0) -> list[str]:
        w = self.workload(name)
        target = w.slices[0] if slice_index is None else slice_name(CLUSTER, slice_index)
        return self.step(ev.WorkerExited(name, w.attempt, target, host, code))

    def finish(self, name: str) -> list[str]:
        """Every worker of the current attempt exits 0."""
        w = self.workload(name)
        hosts = len(self.snapshot.slices[w.slices[0]].nodes)
        return self.step(*(ev.WorkerExited(name, w.attempt, s, h, 0) for s in w.slices for h in range(hosts)))

    def checkpoint(self, name: str, step: int = 1) -> list[str]:
        return self.step(ev.CheckpointRecorded(name, step, self.now + 1))


def holding(name: str, slices: tuple[str, ...], priority: str = "medium", device: str = "v6e-16", **more: Any) -> Workload:
    """A running workload on ``slices``."""
    return Workload(
        spec=spec(name, len(slices), priority, device, **more),
        seq=0,
        created_at=0.0,
        phase=WorkloadPhase.RUNNING,
        slices=slices,
        attempt=1,
        running_since=0.0,
    )


def capacity_of(
    slices: list[tuple[str, str]], workloads: tuple[Workload, ...] = (), down: tuple[str, ...] = ()
) -> tuple[Capacity, dict[str, Workload]]:
    """A round's capacity over one-host slices given as (name, device type), in ordinal order;
    the slices in ``down`` have their node failed. Returns it with the workloads it reads."""
    records = [Slice(name, device, (f"{name}-0",), ordinal) for ordinal, (name, device) in enumerate(slices)]
    nodes = [Node(f"{name}-0", name, 0, NodeState.FAILED if name in down else NodeState.READY) for name, _ in slices]
    snapshot = Snapshot.build(0.0, records, nodes, workloads)
    live = dict(snapshot.workloads)
    return Capacity(snapshot, live), live
