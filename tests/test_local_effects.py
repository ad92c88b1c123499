"""What actions do to a local cluster's workers (``backends/local/controller/enactment.py``), the timeline's
text (``timeline.py``), the worker identity shared by rows and launches, and the worker
environment the local launcher derives from the contract."""

from __future__ import annotations

import contextlib
import dataclasses

from pathlib import Path

import pytest

from hotswap.api import worker as contract
from hotswap.api.launch import HELD_START_KEY, Launch
from hotswap.api.membership import Membership
from hotswap.api.spec import workload_spec
from hotswap.backends.local import timeline
from hotswap.backends.local.controller import enactment as effects
from hotswap.backends.local.controller.enactment import Launcher, WorkerPlan
from hotswap.backends.local.workload_files import membership_path, staged_membership_path
from hotswap.backends.local.workers.environment import worker_environment
from hotswap.backends.local.workers.supervisor import WorkerLaunch
from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.effects import effect_of
from hotswap.core.model import Node, Slice, Snapshot
from hotswap.core.workload import Workload
from hotswap.backends.local.resize import resize_events
from hotswap.store.codec import workload_to_json
from hotswap.store.paths import ClusterPaths
from hotswap.backends.local.tables import SPARE, LocalStore, WorkerIdentity, WorkerRow
from hotswap.store.state import ClusterRecord

SLICES = ("s0", "s1", "s2")


def workload(
    attempt: int = 2, min_slices: int | None = None, slices: tuple[str, ...] = ("s0", "s1"), env: dict[str, str] | None = None
) -> Workload:
    spec = workload_spec(name="w", command="python t.py", device_type="v5p-16", num_slices=2, min_slices=min_slices, env=env or {})
    return Workload(spec=spec, seq=4, created_at=1.0, attempt=attempt, slices=slices)


def row(worker_id: int, attempt: int, slice_: str, state: str = "running") -> WorkerRow:
    identity = WorkerIdentity("w", 4, attempt, slice_, SLICES.index(slice_), 0, f"{slice_}-0")
    return WorkerRow(worker_id, identity, f"/w/{worker_id}", 100 + worker_id, 1, state, None, 0.0, None, None, None)


LIVE = (row(1, 1, "s2", "stopping"), row(2, 2, "s0"), row(3, 2, "s1"))


def snapshot() -> Snapshot:
    slices = [Slice(name, "v5p-16", (f"{name}-0", f"{name}-1"), i) for i, name in enumerate(SLICES)]
    nodes = [Node(f"{name}-{h}", name, h) for name in SLICES for h in range(2)]
    return Snapshot.build(0.0, slices, nodes, [workload()])


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (act.Reject("w", "no"), WorkerPlan()),
        (act.Complete("w"), WorkerPlan()),
        (act.Preempt("w", "high", "preempted by high"), WorkerPlan(stop=LIVE[1:])),
        (act.Requeue("w", "lost"), WorkerPlan(stop=LIVE[1:])),
        (act.Fail("w", "boom"), WorkerPlan(stop=LIVE[1:])),
        (act.Remove("w"), WorkerPlan(stop=LIVE[1:])),
        (
            act.Restart("w", 3, ("s1", "s2"), "node failed", charged=False),
            WorkerPlan(stop=LIVE[1:], generation=("s1", "s2"), start=("s1", "s2"), slices=("s1", "s2"), indexes=(0, 1), attempt=3, cause="hotswap"),
        ),
        (
            act.Restart("w", 3, ("s1", "s2"), "exit 42", charged=True),
            WorkerPlan(stop=LIVE[1:], generation=("s1", "s2"), start=("s1", "s2"), slices=("s1", "s2"), indexes=(0, 1), attempt=3, cause="failure"),
        ),
        (
            act.Restart("w", 3, ("s1", "s2"), "waiting", charged=False, start=False),
            WorkerPlan(stop=LIVE[1:], attempt=3, cause="hotswap"),  # the cause is kept for the StartWorkers
        ),
        (
            act.Admit("w", 3, ("s0", "s1")),
            WorkerPlan(stop=LIVE[1:], generation=("s0", "s1"), start=("s0", "s1"), slices=("s0", "s1"), indexes=(0, 1), attempt=3, cause="preemption"),
        ),
        (
            act.Admit("w", 1, ("s0", "s1")),
            WorkerPlan(stop=(), generation=("s0", "s1"), start=("s0", "s1"), slices=("s0", "s1"), indexes=(0, 1), attempt=1, cause="start"),
        ),
        (act.Admit("w", 2, ("s0", "s1"), start=False), WorkerPlan(attempt=2, cause="preemption")),  # this attempt's workers are kept
        (
            act.StartWorkers("w", 3, ("s0", "s1")),
            WorkerPlan(generation=("s0", "s1"), start=("s0", "s1"), slices=("s0", "s1"), indexes=(0, 1), attempt=3),
        ),
        (act.ScaleDown("w", ("s1",), ("s0",), 2, "node failed", ("s0",), (1,)), WorkerPlan(stop=(LIVE[2],), generation=("s0",))),
        (
            act.ScaleUp("w", ("s1",), ("s0", "s1"), 3, ("s0", "s1")),  # s1's worker is the joiner's predecessor's row
            WorkerPlan(generation=("s0", "s1"), start=("s1",), slices=("s0", "s1"), indexes=(1,), attempt=2, cause="elastic"),
        ),
    ],
    ids=lambda value: type(value).__name__ if not isinstance(value, WorkerPlan) else "",
)
def test_plan_of_each_action(action: act.Action, expected: WorkerPlan) -> None:
    assert effects.plan(effect_of(action), workload(), LIVE) == expected


def test_a_joiner_starts_as_the_replica_the_core_assigned_it() -> None:
    """Replicas 0, 1, 2 on s0, s1, s2; s1 was lost (the core's list is now s0, s2) and comes
    back: the core gives its joiner the parked index 1 again, not 2 (the survivor on s2's), and
    the local plan starts it as that replica, as Kubernetes releases its pod."""
    grown = workload(min_slices=2, slices=("s0", "s2", "s1"))
    grown = dataclasses.replace(grown, spec=grown.spec.model_copy(update={"num_slices": 3}))
    survivors = (row(2, 2, "s0"), row(4, 2, "s2"), row(3, 2, "s1", "stopping"))
    plan = effects.plan(effect_of(act.ScaleUp("w", ("s1",), ("s0", "s2", "s1"), 4, ("s0", "s1", "s2"))), grown, survivors)
    assert plan.start == ("s1",) and plan.indexes == (1,) and plan.slices == ("s0", "s2", "s1")
    two = effects.plan(effect_of(act.ScaleUp("w", ("s1", "s0"), ("s2", "s1", "s0"), 4, ("s1", "s0", "s2"))), grown, (row(4, 2, "s2"),))
    assert two.indexes == (0, 1)  # the parked indexes, in order


def test_every_action_type_is_planned_and_has_a_timeline_message() -> None:
    examples = {
        act.Reject: act.Reject("w", "r"), act.Admit: act.Admit("w", 1, ("s0",)), act.Preempt: act.Preempt("w", "p", "r"),
        act.Restart: act.Restart("w", 1, ("s0",), "r", True), act.StartWorkers: act.StartWorkers("w", 1, ("s0",)),
        act.Requeue: act.Requeue("w", "r"), act.ScaleDown: act.ScaleDown("w", ("s1",), ("s0",), 1, "r", ("s0",), (1,)),
        act.ScaleUp: act.ScaleUp("w", ("s1",), ("s0", "s1"), 1, ("s0", "s1")), act.Fail: act.Fail("w", "r"),
        act.Complete: act.Complete("w"), act.Remove: act.Remove("w"),
    }
    assert set(examples) == set(act.ACTION_TYPES)
    state = snapshot()
    for action in examples.values():
        assert isinstance(effects.plan(effect_of(action), workload(), ()), WorkerPlan)
        entry = timeline.action_entry(effect_of(action), state, state)
        assert entry.kind == type(action).__name__.lower() and entry.message and entry.workload == "w"
        assert entry.seq == (None if isinstance(action, act.Reject) else 4)  # a rejected workload has no timeline


def test_timeline_entries_of_inputs() -> None:
    state = snapshot()
    entries = timeline.input_entries(
        [ev.NodeFailed("s0-1"), ev.NodeRepaired("s2-0"), ev.WorkerExited("w", 2, "s1", 1, 3), ev.WorkerExited("w", 2, "s1", 0, 0)],
        state, state, 5.0,
    )
    assert entries == [
        # The cluster's entry says why (node list shows it): here the command that did it.
        timeline.Entry("node-failed", "node s0-1 failed", data={"node": "s0-1", "reason": "hotswap node fail"}),
        timeline.Entry("node", "node s0-1 failed", "w", 4),  # also in the timeline of the workload it hit
        timeline.Entry("node-repaired", "node s2-0 repaired (uncordoned)", data={"node": "s2-0", "reason": ""}),
        timeline.Entry("worker-exited", "worker s1/1 of attempt 2 exited with code 3", "w", 4, {"code": 3, "attempt": 2}),
    ]
    assert timeline.action_entry(effect_of(act.Admit("w", 3, ("s0",), start=False)), state, state).message == (
        "admitted on s0 (attempt 3); waiting for old workers"
    )


def test_a_worker_row_and_its_launch_share_one_identity(tmp_path: Path) -> None:
    identity = WorkerIdentity("w", 4, 2, "s1", 1, 0, "s1-0")
    with LocalStore.open(tmp_path / "state.db", create=True) as store:
        worker_id = store.worker_rows.add(identity, dir=str(tmp_path), state="starting", started_at=1.0)
        stored = store.worker_rows.get(worker_id)
        spare = store.worker_rows.get(store.worker_rows.add(SPARE, dir="", state="warm"))
    assert stored.identity == identity and not stored.identity.is_spare and stored.state == "starting"
    assert spare.identity == SPARE and spare.identity.is_spare
    launch = WorkerLaunch(identity, tmp_path, tmp_path / "log", "python t.py", "/", {"A": "1"})
    launch.save()
    assert WorkerLaunch.saved(stored) == launch


def test_the_launcher_starts_a_plan_with_the_contract_environment(tmp_path: Path) -> None:
    paths = ClusterPaths("c", tmp_path / "c")
    elastic = workload(min_slices=1, slices=("s2", "s0"), env={"U": "1"})
    with LocalStore.open(paths.database, create=True) as store:
        store.init_cluster(ClusterRecord("c", "local", "v5p-16", 0.0))
        launch = Launch(environ={"PATH": "/bin"}, cwd="/", checkpoint_dir=str(tmp_path / "ck"))
        store.launches.add("w", workload_to_json(elastic), launch)
        survivor = WorkerRow(1, WorkerIdentity("w", 4, 2, "s2", 0, 0, "s2-0"), "/w/1", 101, 1, "running", None, 0.0, None, None, None)
        plan = effects.plan(effect_of(act.ScaleUp("w", ("s0",), ("s2", "s0"), 3, ("s2", "s0"))), elastic, (survivor,))
        launcher = Launcher(store, paths)
        launches = launcher.launches(elastic, plan, snapshot())
        generation, port = store.launches.membership("w")
        # Staged only: the workers see a generation once its round has committed.
        assert not membership_path(paths.workload_dir("w", 4)).exists()
        launcher.publish_committed()
    assert [(x.identity.slice, x.identity.replica, x.identity.host, x.identity.node) for x in launches] == [
        ("s0", 1, 0, "s0-0"), ("s0", 1, 1, "s0-1"),
    ]
    assert [x.env[contract.RANK] for x in launches] == ["2", "3"]  # replica 1 of 2 hosts per slice
    assert all(x.env[contract.MASTER_PORT] == str(port) and x.env["U"] == "1" for x in launches)
    membership = Membership.from_json(membership_path(paths.workload_dir("w", 4)).read_text())
    assert generation == 1 and (membership.generation, membership.slices, membership.master_port) == (1, ("s2", "s0"), port)


def test_a_generation_staged_by_a_round_that_rolled_back_is_never_published(tmp_path: Path) -> None:
    """A controller killed inside a round's transaction leaves the generation it staged; the
    database still holds the one before. Published, it would make a drained worker leave (exit
    143, judged a failure) for a drain that was never committed."""
    paths = ClusterPaths("c", tmp_path / "c")
    elastic = workload(min_slices=1, slices=("s2", "s0"))
    directory = paths.workload_dir("w", 4)
    with LocalStore.open(paths.database, create=True) as store:
        store.init_cluster(ClusterRecord("c", "local", "v5p-16", 0.0))
        store.launches.add("w", workload_to_json(elastic), Launch(environ={}, cwd="/", checkpoint_dir=str(tmp_path / "ck")))
        plan = effects.plan(effect_of(act.ScaleUp("w", ("s0",), ("s2", "s0"), 3, ("s2", "s0"))), elastic, ())
        with contextlib.suppress(RuntimeError), store.transaction():
            Launcher(store, paths).launches(elastic, plan, snapshot())
            raise RuntimeError("the controller dies before the commit")
        assert store.launches.membership("w")[0] == 0 and staged_membership_path(directory).exists()
        Launcher(store, paths).publish_committed([elastic])  # what the next controller does first
    assert not staged_membership_path(directory).exists() and not membership_path(directory).exists()


def test_why_held_back_workers_start_survives_a_controller_restart(tmp_path: Path) -> None:
    """A hotswap under BlockingRecreate holds its workers back until the old ones exit; the
    cause is committed with that round, so a new controller (a new Launcher) still tells the
    workers why they start."""
    paths = ClusterPaths("c", tmp_path / "c")
    held = workload(attempt=3, slices=("s1", "s2"))
    with LocalStore.open(paths.database, create=True) as store:
        store.init_cluster(ClusterRecord("c", "local", "v5p-16", 0.0))
        store.launches.add("w", workload_to_json(held), Launch(environ={}, cwd="/", checkpoint_dir=str(tmp_path)))
        assert Launcher(store, paths).launches(held, WorkerPlan(attempt=3, cause="hotswap"), snapshot()) == []
        start = effects.plan(effect_of(act.StartWorkers("w", 3, ("s1", "s2"))), held, ())
        assert start.cause is None  # the StartWorkers itself does not know why
        launches = Launcher(store, paths).launches(held, start, snapshot())  # as after a controller restart
        left = store.launches.get("w")
    assert {x.env[contract.HOTSWAP_START_CAUSE] for x in launches} == {"hotswap"}
    assert left.held_start is None and HELD_START_KEY not in left.to_dict()  # used once: a later attempt does not inherit it


@pytest.mark.parametrize(("replica", "host", "hosts", "slices", "attempt"), [(0, 0, 1, 1, 1), (1, 1, 2, 3, 4), (2, 3, 4, 3, 1)])
def test_the_local_environment_is_the_contracts(replica: int, host: int, hosts: int, slices: int, attempt: int) -> None:
    names = tuple(f"s{i}" for i in range(slices))
    env = worker_environment(
        base={}, user={}, cluster="c", workload="w", slices=names, num_slices=slices, replica=replica, host=host,
        hosts_per_slice=hosts, attempt=attempt, master_port=1234, checkpoint_dir="/ck", events_file=None,
        grace_s=contract.DEFAULT_GRACE_PERIOD_S, membership_file=None,
    )
    seen = contract.WorkerEnv.from_environ(env)
    assert seen.rank == contract.global_rank(replica, host, hosts)
    assert seen.world_size == contract.world_size(slices, hosts)
    assert (seen.attempt, seen.restart_count, seen.slice_name) == (attempt, attempt - 1, names[replica])
    assert (seen.master_addr, seen.grace_period_s) == (contract.DEFAULT_MASTER_ADDR, contract.DEFAULT_GRACE_PERIOD_S)
    assert (env[contract.LOCAL_RANK], env[contract.LOCAL_WORLD_SIZE]) == ("0", "1")  # one process per host
    indices = {name: int(env[name]) for name in (contract.JOB_INDEX, contract.JOB_COMPLETION_INDEX, contract.HOTSWAP_HOSTS_PER_SLICE, contract.HOTSWAP_RESTART_COUNT)}
    assert {name: int(env[name]) for name in contract.DERIVED} == contract.derived_values(indices)


def test_resize_adds_new_names_and_removes_free_slices_first() -> None:
    record = ClusterRecord("c", "local", "v5p-16", 0.0)
    state = snapshot()  # w holds s0 and s1
    grown = resize_events(state, record, 5)
    assert [(e.name, e.nodes) for e in grown] == [("c-np-0", ("c-np-0-0", "c-np-0-1")), ("c-np-1", ("c-np-1-0", "c-np-1-1"))]
    assert resize_events(state, record, 3) == []
    assert resize_events(state, record, 1) == [ev.SliceRemoved("s2"), ev.SliceRemoved("s1")]



def test_a_scales_timeline_entry_carries_the_replica_map_after_it() -> None:
    state = snapshot()
    shrunk = timeline.action_entry(effect_of(act.ScaleDown("w", ("s1",), ("s0", "s2"), 2, "lost", ("s0", None, "s2"), (1,))), state, state)
    assert shrunk.data is not None and (shrunk.data["replicas"], shrunk.data["parked"]) == (("s0", None, "s2"), (1,))
    grown = timeline.action_entry(effect_of(act.ScaleUp("w", ("s1",), ("s0", "s2", "s1"), 3, ("s0", "s1", "s2"))), state, state)
    assert grown.data is not None and grown.data["replicas"] == ("s0", "s1", "s2")


def test_a_start_a_later_action_of_the_same_round_undid_is_not_made() -> None:
    """A worker's exit restarts w into attempt 3 on s0 and s1; in the same round a higher
    priority preempts it (chaos seed 1342838076: the queued workload's new worker ran on the
    slice its preemptor held). Only a start the round's result still wants is made."""
    from hotswap.api.phases import WorkloadPhase
    from hotswap.backends.local.controller.rounds import still_wanted

    def launch(attempt: int, slice_: str) -> WorkerLaunch:
        identity = WorkerIdentity("w", 4, attempt, slice_, SLICES.index(slice_), 0, f"{slice_}-0")
        return WorkerLaunch(identity, Path("/w"), Path("/w/log"), "python t.py", "/", {})

    def result(record: Workload) -> Snapshot:
        slices = [Slice(name, "v5p-16", (f"{name}-0", f"{name}-1"), i) for i, name in enumerate(SLICES)]
        nodes = [Node(f"{name}-{h}", name, h) for name in SLICES for h in range(2)]
        return Snapshot.build(0.0, slices, nodes, [record])

    running = dataclasses.replace(workload(attempt=3), phase=WorkloadPhase.RUNNING)
    assert still_wanted(launch(3, "s0"), result(running))
    assert not still_wanted(launch(3, "s2"), result(running))  # moved off that slice
    assert not still_wanted(launch(2, "s0"), result(running))  # restarted again since
    queued = dataclasses.replace(workload(attempt=3, slices=()), phase=WorkloadPhase.QUEUED)
    assert not still_wanted(launch(3, "s0"), result(queued))  # preempted after the restart
    assert not still_wanted(launch(3, "s0"), result(dataclasses.replace(running, seq=5)))  # deleted, created again
