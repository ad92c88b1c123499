"""One table of action sequences, checked against both backends' plans: the core decides which
slice runs which replica index (``Workload.replica_map``, carried by each action's effect), and
the local backend and the Kubernetes backend only apply it.

Each row drives the core (``builders.World``) through rounds of events; every round's decision is
enacted by the local plan (``backends/local/controller/enactment.py``, over a table of worker rows) and by the
Kubernetes planner (``backends/kubernetes/planning.py``, over a JobSet whose Jobs and pods are
kept as JobSet and the Job controller would). After every round, for every workload: the live
workers of its current attempt are started as the replica indexes of the core's map, locally
(``JOB_INDEX`` of each worker) and on Kubernetes (the map recorded in the state annotation, and
each released pod's ``JOB_INDEX`` on the slice it is pinned to), no two workers share an index,
and the slices started in the round start as the same indexes on both. Then old records: a
record of an earlier release reads back with its map, on both backends.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from builders import CLUSTER, World, fail, repair, spec

from hotswap.api.cluster import node_name, slice_name
from hotswap.api.phases import WorkloadPhase
from hotswap.api.spec import WorkloadSpec
from hotswap.api.launch import Launch
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes import operations as ops
from hotswap.backends.kubernetes.observation import observe
from hotswap.backends.kubernetes.planning import plan
from hotswap.backends.kubernetes.settings import KubeSettings
from hotswap.backends.kubernetes.state_annotation import decode_state, state_of
from hotswap.backends.local.controller import enactment as effects
from hotswap.backends.local.tables import LocalStore, WorkerIdentity, WorkerRow
from hotswap.core import events as ev
from hotswap.core.effects import ActionEffect, effects_of
from hotswap.core.model import Node, Slice, Snapshot
from hotswap.core.scheduler import Decision
from hotswap.core.workload import Workload
from hotswap.store.state import ClusterRecord

DEVICE = "v6e-4"  # one host a slice: one worker (one pod) a replica


def np(index: int) -> str:
    return slice_name(CLUSTER, index)


# ---------------------------------------------------------------------- the local backend


class LocalWorkers:
    """The local backend's worker rows, as its round writes them from each effect's plan."""

    def __init__(self) -> None:
        self.rows: list[WorkerRow] = []
        self.ids = itertools.count(1)

    def enact(self, effect: ActionEffect, workload: Workload) -> dict[str, int]:
        """One action's plan on the rows; returns the replica index of each slice it starts."""
        live = [r for r in self.rows if r.identity.workload == workload.name and r.identity.seq == workload.seq]
        planned = effects.plan(effect, workload, live)
        stopped = {r.id for r in planned.stop}
        self.rows = [dataclasses.replace(r, state="stopping") if r.id in stopped else r for r in self.rows]
        for slice_, replica in zip(planned.start, planned.indexes, strict=True):
            identity = WorkerIdentity(workload.name, workload.seq, planned.attempt, slice_, replica, 0, node_name(slice_, 0))
            self.rows.append(WorkerRow(next(self.ids), identity, "", 1, 1, "running", None, 0.0, None, None, None))
        return dict(zip(planned.start, planned.indexes, strict=True))

    def exited(self) -> None:
        """The workers told to stop are gone (before the next round)."""
        self.rows = [r for r in self.rows if r.state != "stopping"]

    def running(self, workload: Workload) -> dict[int, str]:
        """Replica index -> slice of the workload's running workers of its current attempt."""
        mine = [
            r.identity for r in self.rows
            if r.state != "stopping" and r.identity.workload == workload.name and r.identity.attempt == workload.attempt
        ]
        indexes = [who.replica for who in mine]
        assert len(set(indexes)) == len(indexes), f"two local workers of {workload.name} share an index: {mine}"
        return {who.replica: who.slice for who in mine}


# ---------------------------------------------------------------------- the Kubernetes backend


class JobSets:
    """Each workload's JobSet, its Jobs (one a replica index) and their pods, kept as JobSet
    and the Job controller keep them: created suspended; unsuspended, a Job a replica index,
    each with a gated pod; a Job deleted is recreated under a new UID, with a new gated pod."""

    def __init__(self) -> None:
        self.jobsets: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, dict[int, str]] = {}  # JobSet -> replica index -> current Job's uid
        self.pods: dict[str, dict[str, Any]] = {}  # pod name -> pod
        self.uids = itertools.count(1)

    def create(self, workload: WorkloadSpec) -> None:
        annotations = {labels.SPEC_ANNOTATION: workload.model_dump_json()}
        self.jobsets[workload.name] = {
            "metadata": {"name": workload.name, "uid": f"js-{workload.name}", "annotations": annotations},
            "spec": {"suspend": True},
            "status": {},
        }
        self.jobs[workload.name] = {}

    def observe(self, now: float):
        jobs = [
            {"metadata": {"name": f"{name}-slice-{index}", "uid": uid, "labels": {
                labels.JOBSET_NAME_LABEL: name, labels.REPLICATED_JOB_NAME_LABEL: "slice", labels.JOB_INDEX_LABEL: str(index),
            }}}
            for name, by_index in self.jobs.items() for index, uid in by_index.items()
        ]
        return observe([], list(self.jobsets.values()), jobs, list(self.pods.values()), KubeSettings(), CLUSTER, now=now)

    def enact(self, operations: list[ops.Operation]) -> None:
        for op in operations:
            if isinstance(op, ops.PatchJobSet):
                annotations = self.jobsets[op.jobset]["metadata"]["annotations"]
                for key, value in op.annotations.items():
                    if value is None:
                        annotations.pop(key, None)
                    else:
                        annotations[key] = value
                if op.suspend is not None:
                    self.jobsets[op.jobset]["spec"]["suspend"] = op.suspend
                    self._suspended(op.jobset) if op.suspend else self._unsuspended(op.jobset)
            elif isinstance(op, ops.DeleteJob):
                by_index = self.jobs[op.jobset]
                index = next((i for i, uid in by_index.items() if uid == op.uid), None)
                if index is not None:
                    self._drop_pods(op.uid)
                    self._start_job(op.jobset, index)  # JobSet recreates it
            elif isinstance(op, ops.PlacePod):
                pod = self.pods[op.pod]
                pod["metadata"]["annotations"].update(op.annotations)
                pod["spec"]["schedulingGates"] = [{"name": g} for g in op.gates]
            elif isinstance(op, ops.AnnotatePod):
                self.pods[op.pod]["metadata"]["annotations"].update(op.annotations)

    def _unsuspended(self, name: str) -> None:
        spec = WorkloadSpec.model_validate_json(self.jobsets[name]["metadata"]["annotations"][labels.SPEC_ANNOTATION])
        for index in range(spec.num_slices):
            self._start_job(name, index)

    def _suspended(self, name: str) -> None:
        for uid in self.jobs[name].values():
            self._drop_pods(uid)
        self.jobs[name] = {}

    def _start_job(self, name: str, index: int) -> None:
        uid = f"job-{next(self.uids)}"
        self.jobs[name][index] = uid
        pod = f"{name}-slice-{index}-0-{uid}"
        self.pods[pod] = {
            "metadata": {
                "name": pod, "uid": f"pod-{uid}",
                "labels": {labels.JOBSET_NAME_LABEL: name, labels.REPLICATED_JOB_NAME_LABEL: "slice", labels.JOB_INDEX_LABEL: str(index)},
                "annotations": {labels.JOB_COMPLETION_INDEX_ANNOTATION: "0"},
                "ownerReferences": [{"kind": "Job", "uid": uid}],
            },
            "spec": {"schedulingGates": [{"name": labels.PLACEMENT_GATE}]},
            "status": {"phase": "Pending"},
        }

    def _drop_pods(self, job_uid: str) -> None:
        self.pods = {n: p for n, p in self.pods.items() if p["metadata"]["ownerReferences"][0]["uid"] != job_uid}

    def recorded(self, name: str) -> list[str | None]:
        """The replica map the JobSet's state annotation records."""
        return json.loads(self.jobsets[name]["metadata"]["annotations"][labels.STATE_ANNOTATION])["replicas"]

    def released(self, name: str, attempt: int) -> dict[int, str]:
        """Replica index (the pod's JOB_INDEX) -> the slice its released pod of ``attempt`` is pinned to."""
        found: dict[int, str] = {}
        for pod in self.pods.values():
            meta = pod["metadata"]
            if meta["labels"][labels.JOBSET_NAME_LABEL] != name or pod["spec"]["schedulingGates"]:
                continue
            if meta["annotations"].get(labels.ATTEMPT_ANNOTATION) != str(attempt):
                continue
            index = int(meta["labels"][labels.JOB_INDEX_LABEL])
            assert index not in found, f"two released pods of {name} share index {index}"
            found[index] = meta["annotations"][labels.SLICE_ANNOTATION]
        return found

    def releasing(self, operations: list[ops.Operation]) -> dict[str, int]:
        """Slice -> replica index of each pod released by ``operations``."""
        return {
            op.annotations[labels.SLICE_ANNOTATION]: int(self.pods[op.pod]["metadata"]["labels"][labels.JOB_INDEX_LABEL])
            for op in operations if isinstance(op, ops.PlacePod)
        }


# ---------------------------------------------------------------------- both, round by round


Step = Callable[[World], list[ev.Event]]


def events(*given: ev.Event) -> Step:
    return lambda world: list(given)


def create(name: str, slices: int, priority: str = "medium", **more: Any) -> Step:
    return events(ev.WorkloadCreated(spec(name, slices, priority, DEVICE, **more)))


def stopped(name: str) -> Step:
    """Every stopping attempt of ``name`` has exited."""
    return lambda world: [ev.WorkersStopped(name, a) for a in sorted(world.workload(name).stopping)]


def exit_code(name: str, slice_index: int, code: int) -> Step:
    return lambda world: [ev.WorkerExited(name, world.workload(name).attempt, np(slice_index), 0, code)]


def added(index: int) -> Step:
    return events(ev.SliceAdded(np(index), DEVICE, (node_name(np(index), 0),)))


@dataclasses.dataclass
class Row:
    id: str
    slices: int  # the cluster's
    steps: list[Step]
    expected: dict[str, tuple[str | None, ...]]  # the replica map each workload ends with


TABLE = [
    Row("admit", 3, [create("w", 3)], {"w": (np(0), np(1), np(2))}),
    Row("hotswap-restart", 4, [create("w", 3), events(fail(1))], {"w": (np(0), np(3), np(2))}),
    Row(
        "elastic-shrink-of-a-middle-slice-then-grow-back", 3,
        [create("w", 3, min_slices=2), events(fail(1)), events(repair(1))], {"w": (np(0), np(1), np(2))},
    ),
    Row(
        "grow-back-onto-a-new-slice", 3,
        [create("w", 3, min_slices=2), events(fail(1)), added(3)], {"w": (np(0), np(3), np(2))},
    ),
    Row(
        "elastic-hotswap-shrinks-and-grows-in-one-round", 4,
        [create("w", 3, min_slices=2), events(fail(1))], {"w": (np(0), np(3), np(2))},
    ),
    Row(
        "two-parked-indexes-filled-lowest-first", 4,
        [create("w", 4, min_slices=2), events(fail(1)), events(fail(2)), events(repair(2)), events(repair(1))],
        {"w": (np(0), np(2), np(1), np(3))},
    ),
    Row(
        "shrink-for-higher-priority-work", 3,
        [create("low", 3, "low", min_slices=1), create("high", 1, "high")],
        {"low": (np(0), np(1)), "high": (np(2),)},
    ),
    Row(
        "preempt-then-readmit", 2,
        [create("low", 2, "low"), create("high", 2, "high"), stopped("low"), events(ev.WorkloadDeleted("high"))],
        {"low": (np(0), np(1))},
    ),
    Row(
        "held-back-restart-then-start-workers", 3,
        [create("b", 2, restart_strategy="BlockingRecreate"), events(fail(1)), stopped("b")], {"b": (np(0), np(2))},
    ),
    Row(
        "held-back-restart-whose-reserved-slice-is-replaced-before-it-starts", 4,
        [create("b", 2, restart_strategy="BlockingRecreate"), events(fail(1)), events(fail(2)), stopped("b")],
        {"b": (np(0), np(3))},
    ),
    Row(
        "a-restart-after-a-shrink-places-every-replica-again", 3,
        [create("w", 3, min_slices=2, max_restarts=1), events(fail(1)), exit_code("w", 2, 42)],
        {"w": (np(0), np(2))},
    ),
]


def check_workload(workload: Workload, local: LocalWorkers, kube: JobSets) -> None:
    core = {index: s for index, s in enumerate(workload.replica_map) if s is not None}
    padded = list(workload.replica_map) + [None] * (workload.spec.num_slices - len(workload.replica_map))
    assert kube.recorded(workload.name) == padded, "the state annotation records the core's map"
    running = workload.phase is WorkloadPhase.RUNNING
    assert local.running(workload) == (core if running else {}), "local workers start as the core assigned them"
    assert kube.released(workload.name, workload.attempt) == (core if running else {}), "pods are released as assigned"


@pytest.mark.parametrize("row", TABLE, ids=[row.id for row in TABLE])
def test_both_backends_start_each_slice_as_the_replica_the_core_assigned_it(row: Row) -> None:
    world = World(slices=row.slices, device=DEVICE)
    local, kube = LocalWorkers(), JobSets()
    for step in row.steps:
        local.exited()
        given = step(world)
        for event in given:
            if isinstance(event, ev.WorkloadCreated):
                kube.create(event.spec)
        old = world.snapshot
        world.step(*given)
        decision = Decision(world.snapshot, tuple(world.last))
        decided = effects_of(decision.actions)  # once per action, for both backends
        started_locally: dict[str, int] = {}
        for effect in decided:
            name = effect.action.workload
            workload = world.snapshot.workloads.get(name) or old.workloads.get(name)
            if workload is not None:
                started_locally.update(local.enact(effect, workload))
        operations = plan(kube.observe(world.now), decision, decided)
        kube.enact(operations)
        released = kube.releasing(operations)
        settle = plan(kube.observe(world.now), Decision(world.snapshot, ()), [])  # the next reconcile
        kube.enact(settle)
        released.update(kube.releasing(settle))
        for effect in decided:
            for slice_ in effect.start:
                assert started_locally[slice_] == effect.replica_of(slice_)
        assert {s: i for s, i in released.items() if s in started_locally} == started_locally, "same index on both"
        for workload in world.snapshot.workloads.values():
            check_workload(workload, local, kube)
    assert {name: w.replica_map for name, w in world.snapshot.workloads.items()} == row.expected


# ---------------------------------------------------------------------- old records

# What the previous release wrote for an elastic workload running on replicas 0 and 2 of 3 (its
# slice of replica 1 lost): the local snapshot's record, which had no replica map, and the
# Kubernetes state annotation, which kept one beside the core's record.
OLD_LOCAL_RECORD = (
    '{"attempt": 1, "created_at": 100.0, "disruptions": 0, "exited_ok": [], "last_checkpoint_at": null, '
    '"last_checkpoint_step": null, "membership": 1, "phase": "RUNNING", "preemptions": 0, "restarts": 0, '
    '"running_since": 100.0, "seq": 4, "slices": ["s0", "s2"], "spec": {"base_docker_image": null, '
    '"checkpoint_dir": null, "command": "python3 train.py", "debug_dump_gcs": null, "device_type": "v6e-4", '
    '"docker_image": null, "docker_name": null, "env": {}, "hang_timeout_s": null, "max_restarts": 0, '
    '"min_slices": 2, "name": "w", "num_slices": 3, "priority": "medium", "restart_on_exit_codes": "42,127-255", '
    '"restart_strategy": "Recreate", "script_dir": null, "termination_grace_period_s": 30.0}, '
    '"status_message": "scaled down to 2 slice(s): node s1-0 failed", "status_time": 130.0, "stopping": []}'
)
OLD_ANNOTATION = (
    '{"attempt": 1, "created_at": 100.0, "disruptions": 0, "exited_ok": [], "last_checkpoint_at": null, '
    '"last_checkpoint_step": null, "membership": 1, "phase": "RUNNING", "phase_seconds": {"QUEUED": 0.0}, '
    '"phase_since": 100.0, "preemptions": 0, "replicas": ["s0", null, "s2"], "restarts": 0, "running_since": 100.0, '
    '"seq": 4, "slices": ["s0", "s2"], "start_cause": "start", "status_message": "scaled down to 2 slice(s): node '
    's1-0 failed", "status_time": 130.0, "stopping": []}'
)


def _local_cluster(tmp_path: Path, record: str, rows: list[tuple[str, int]]) -> Workload:
    """A local cluster's database holding ``record`` and live workers (slice, replica index) of
    its attempt, read back as the controller does when it starts."""
    slices = [Slice(f"s{i}", DEVICE, (f"s{i}-0",), i) for i in range(3)]
    nodes = [Node(f"s{i}-0", f"s{i}", 0) for i in range(3)]
    with LocalStore.open(tmp_path / "state.db", create=True) as store:
        store.init_cluster(ClusterRecord("c", "local", DEVICE, 0.0))
        store.launches.add("w", record, Launch(environ={}, cwd="/", checkpoint_dir="/c"))
        store.save_snapshot(Snapshot.build(), Snapshot.build(0.0, slices, nodes, ()))
        for slice_, replica in rows:
            store.worker_rows.add(WorkerIdentity("w", 4, 1, slice_, replica, 0, f"{slice_}-0"), dir="", state="running")
        return store.load_snapshot(200.0).workloads["w"]


def test_an_old_local_record_mid_shrink_keeps_the_indexes_its_workers_run_as(tmp_path: Path) -> None:
    """An upgrade while an elastic workload runs on replicas 0 and 2: its record has no map
    (replica i on slices[i] would make s2 replica 1); its live workers say s2 is replica 2, so a
    grow-back's joiner takes 1, not a survivor's index."""
    loaded = _local_cluster(tmp_path, OLD_LOCAL_RECORD, [("s0", 0), ("s2", 2)])
    assert loaded.replica_map == ("s0", None, "s2")


def test_an_old_local_record_without_live_workers_to_say_gets_its_slices_map(tmp_path: Path) -> None:
    assert _local_cluster(tmp_path, OLD_LOCAL_RECORD, []).replica_map == ("s0", "s2")


def test_a_recorded_map_is_the_local_records_own_whatever_the_rows_say(tmp_path: Path) -> None:
    current = json.loads(OLD_LOCAL_RECORD)
    current["replicas"] = ["s0", "s2"]  # as this release writes it: the rows cannot override it
    assert _local_cluster(tmp_path, json.dumps(current), [("s0", 0), ("s2", 2)]).replica_map == ("s0", "s2")


def test_an_old_annotation_reads_back_with_its_map_and_is_written_back_the_same() -> None:
    workload_spec = WorkloadSpec.model_validate(json.loads(OLD_LOCAL_RECORD)["spec"])
    state = decode_state(OLD_ANNOTATION, workload_spec)
    assert state is not None
    workload = state.workload
    assert workload.replica_map == ("s0", None, "s2")
    # Nothing changed: the record this release writes is the one it read, byte for byte.
    assert state_of(workload, state, 200.0, start_cause="start").encode() == OLD_ANNOTATION
