"""The text of a local cluster's timeline (``workload describe``, the demo's live view): an entry
for each input event worth showing and one for each action, written in the round that decides
them. Pure: the controller writes the entries with :meth:`~hotswap.store.state.Store.record_event`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from hotswap.core import events as ev
from hotswap.core.effects import ActionEffect, Outcome
from hotswap.core.model import Snapshot

_NODE_VERBS: dict[type, str] = {
    ev.NodeFailed: "failed",
    ev.NodeCordoned: "cordoned",
    ev.NodeDrained: "drained",
    ev.NodeRepaired: "repaired (uncordoned)",
}
# Why a node is out when nobody said more: the command that took it out.
_NODE_REASONS: dict[type, str] = {
    ev.NodeFailed: "hotswap node fail",
    ev.NodeCordoned: "hotswap node cordon",
    ev.NodeDrained: "hotswap node drain",
    ev.NodeRepaired: "",
}
NODE_ENTRY_KINDS = tuple(f"node-{verb.split()[0]}" for verb in _NODE_VERBS.values())


class Entry(NamedTuple):
    kind: str
    message: str
    workload: str | None = None
    seq: int | None = None
    data: dict[str, Any] | None = None


def input_entries(inputs: list[ev.Event], old: Snapshot, new: Snapshot, now: float) -> list[Entry]:
    """Node faults and repairs (also in the timeline of the workload they hit; the cluster's
    entry says why, for ``node list``), slices added and removed, workloads created in this
    round, workers that exited with an error, and hangs."""
    entries = []
    for event in inputs:
        match event:
            case ev.NodeFailed() | ev.NodeCordoned() | ev.NodeDrained() | ev.NodeRepaired():
                verb = _NODE_VERBS[type(event)]
                reason = getattr(event, "reason", "") or _NODE_REASONS[type(event)]
                given = getattr(event, "reason", "")
                message = f"node {event.node} {verb}" + (f": {given}" if given else "")
                entries.append(Entry(f"node-{verb.split()[0]}", message, data={"node": event.node, "reason": reason}))
                node = old.nodes.get(event.node)
                holder = old.holders.get(node.slice) if node else None
                if holder is not None:
                    entries.append(Entry("node", message, holder, old.workloads[holder].seq))
            case ev.SliceAdded(name=name):
                entries.append(Entry("slice-added", f"slice {name} added"))
            case ev.SliceRemoved(name=name):
                entries.append(Entry("slice-removed", f"slice {name} removed"))
            case ev.WorkloadCreated(spec=spec) if spec.name in new.workloads:
                created = new.workloads[spec.name]
                if old.workloads.get(spec.name) is not created and created.created_at == now:
                    entries.append(Entry("created", "created", created.name, created.seq))
            case ev.WorkerExited(code=code) if code != 0 and event.workload in old.workloads:
                workload = old.workloads[event.workload]
                entries.append(
                    Entry(
                        "worker-exited",
                        f"worker {event.slice}/{event.host} of attempt {event.attempt} exited with code {code}",
                        workload.name,
                        workload.seq,
                        {"code": code, "attempt": event.attempt},
                    )
                )
            case ev.WorkerLost() if event.workload in old.workloads:
                workload = old.workloads[event.workload]
                entries.append(
                    Entry("worker-lost", f"worker {event.slice}/{event.host} of attempt {event.attempt} {event.reason}",
                          workload.name, workload.seq, {"attempt": event.attempt})
                )
            case ev.WorkloadHung() if event.workload in old.workloads:
                workload = old.workloads[event.workload]
                entries.append(
                    Entry("hung", f"attempt {event.attempt} hung: {event.reason}", workload.name, workload.seq,
                          {"attempt": event.attempt})
                )
    return entries


def action_entry(effect: ActionEffect, old: Snapshot, new: Snapshot) -> Entry:
    """An action, in words (its effect's message), in the timeline of the workload it concerns
    (a rejected workload has none: its entry is the cluster's); its data is the action's fields
    (a scale's replica map among them)."""
    action = effect.action
    workload = new.workloads.get(action.workload) or old.workloads.get(action.workload)
    seq = workload.seq if workload is not None and effect.outcome is not Outcome.REJECTED else None
    return Entry(type(action).__name__.lower(), effect.message, action.workload, seq, dataclasses.asdict(action))
