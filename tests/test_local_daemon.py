"""The local controller's collaborators, composed as ``controller/assembly.py`` composes them but
around fakes: requests served and rounds run in this process, with no daemon, no socket and no
worker process. The fake workers record what a round asks of them (rows started, stopped,
killed) in a real database; the fake socket records the answers."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hotswap.api.launch import Launch
from hotswap.api.spec import workload_spec
from hotswap.backends.local import requests as rq
from hotswap.backends.local.controller.enactment import Launcher
from hotswap.backends.local.controller.round_inputs import RoundInputs
from hotswap.backends.local.controller.rounds import RoundRunner
from hotswap.backends.local.controller.serving import RequestServing
from hotswap.backends.local.controller.state import ClusterState, Inbox
from hotswap.backends.local.gpu.backing import Backing
from hotswap.backends.local.gpu.nvml import GpuInfo
from hotswap.backends.local.settings import LocalSettings
from hotswap.backends.local.tables import LIVE_WORKER_STATES, LocalStore, WorkerIdentity, WorkerRow
from hotswap.backends.local.workers.supervisor import WorkerLaunch
from hotswap.core import events as ev
from hotswap.store.paths import ClusterPaths
from hotswap.store.state import ClusterRecord


class FakeClaim:
    def verify(self) -> None:
        pass


class FakeServer:
    def __init__(self) -> None:
        self.answered: list[int] = []

    def answer(self, request_id: int) -> None:
        self.answered.append(request_id)

    def fail(self, request_id: int, message: str) -> None:
        raise AssertionError(f"request {request_id} failed: {message}")


class FakeHealth:
    def __init__(self) -> None:
        self.watched: list[Backing | None] = []
        self.repaired_nodes: list[str] = []

    def watch(self, backing: Backing | None) -> None:
        self.watched.append(backing)

    def repaired(self, nodes: Iterable[str]) -> None:
        self.repaired_nodes += nodes


class FakeWorkers:
    """Workers without processes: rows in the real table, and a record of what was asked."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store
        self.pending_exits: dict[int, tuple[int, float]] = {}
        self.stops = self  # the exits a round commits: held by the fake itself
        self.started: list[WorkerIdentity] = []
        self.stopped: list[int] = []  # marked stopping (then SIGTERM)
        self.killed: list[int] = []
        self.spares: list[tuple[int, tuple[str, ...] | None]] = []
        self.zygote: list[bool] = []
        self.stopped_everything = False

    def live(self, workload: str, seq: int, attempt: int | None = None) -> list[WorkerRow]:
        rows = self.store.worker_rows.select(LIVE_WORKER_STATES, workload)
        return [w for w in rows if w.identity.seq == seq and attempt in (None, w.identity.attempt)]

    def on_nodes(self, nodes: Collection[str]) -> list[WorkerRow]:
        return [w for w in self.store.worker_rows.select(LIVE_WORKER_STATES) if w.identity.node in nodes]

    def mark_stopping(self, rows: Iterable[WorkerRow], now: float, grace_s: float | None = None) -> None:
        for row in rows:
            self.store.worker_rows.update(row.id, state="stopping", stop_requested_at=now)

    def add(self, launch: WorkerLaunch, now: float) -> tuple[WorkerRow, WorkerLaunch]:
        worker_id = self.store.worker_rows.add(launch.identity, dir=str(launch.dir), state="starting", started_at=now)
        return self.store.worker_rows.get(worker_id), launch

    def commit_exits(self) -> list[int]:
        return []

    def exits_committed(self, worker_ids: Iterable[int]) -> None:
        pass

    def kill(self, rows: Iterable[WorkerRow]) -> None:
        self.killed += [row.id for row in rows]

    def terminate(self, rows: Iterable[WorkerRow]) -> None:
        self.stopped += [row.id for row in rows]

    def spawn(self, started: Iterable[tuple[WorkerRow, WorkerLaunch | None]]) -> None:
        self.started += [row.identity for row, _ in started]

    def all_gone(self) -> bool:
        return True

    def stop_everything(self, now: float) -> None:
        self.stopped_everything = True

    def resize_spares(self, size: int, preload: tuple[str, ...] | None) -> None:
        self.spares.append((size, preload))

    def use_zygote(self, on: bool) -> None:
        self.zygote.append(on)


class Daemon:
    """The collaborators of one controller, built as the assembly builds them, around fakes."""

    def __init__(self, paths: ClusterPaths, store: LocalStore) -> None:
        self.store = store
        self.state = ClusterState(store.cluster(), store.load_snapshot(time.time()), deleting=store.deleted())
        self.inbox = Inbox(self.state)
        self.workers = FakeWorkers(store)
        self.server = FakeServer()
        self.health = FakeHealth()
        launcher = Launcher(store, paths, lambda: self.state.backing)
        self.rounds = RoundRunner(
            store, FakeClaim(), self.state, self.inbox, self.workers, launcher, self.server, self.health  # type: ignore[arg-type]
        )
        self.serving = RequestServing(store, self.state, self.inbox, self.rounds, self.server, self.workers, self.health)  # type: ignore[arg-type]

    def ask(self, request: rq.LocalRequest) -> tuple[str, str]:
        return self.ask_row(request.kind, request.to_payload())

    def ask_row(self, kind: str, payload: dict[str, Any]) -> tuple[str, str]:
        """Queue a row, serve what is pending, and return the row's outcome."""
        request_id = self.store.requests.submit(kind, payload, time.time())
        self.serving.work()
        served = self.store.requests.get(request_id)
        assert served is not None and request_id in self.server.answered
        return served.status, served.message


@pytest.fixture
def paths(tmp_path: Path) -> ClusterPaths:
    return ClusterPaths("c", tmp_path / "c")


@pytest.fixture
def daemon(paths: ClusterPaths) -> Iterator[Daemon]:
    with LocalStore.open(paths.database, create=True) as store:
        store.init_cluster(ClusterRecord("c", "local", "v6e-4", 0.0, LocalSettings().to_settings()))
        daemon = Daemon(paths, store)
        assert daemon.ask(rq.ResizeCluster(2)) == ("done", "")
        yield daemon


def create(daemon: Daemon, tmp_path: Path, name: str = "w") -> tuple[str, str]:
    spec = workload_spec(name=name, command="python train.py", device_type="v6e-4", num_slices=1, max_restarts=3)
    return daemon.ask(rq.CreateWorkload(spec, Launch({"PATH": "/bin"}, "/", str(tmp_path / "ckpt" / name))))


def test_a_resize_request_adds_the_slices_with_one_round(daemon: Daemon) -> None:
    assert sorted(daemon.state.snapshot.slices) == ["c-np-0", "c-np-1"]
    assert daemon.store.load_snapshot(time.time()).slices.keys() == daemon.state.snapshot.slices.keys()  # committed
    assert daemon.workers.started == [] and daemon.health.watched == []  # an emulated cluster: no GPU to watch


def test_a_create_request_starts_its_workers_after_the_commit(daemon: Daemon, tmp_path: Path) -> None:
    assert create(daemon, tmp_path) == ("done", "")
    (started,) = daemon.workers.started
    assert (started.workload, started.attempt, started.replica, started.host) == ("w", 1, 0, 0)
    assert daemon.store.launches.get("w").environ == {"PATH": "/bin"}  # the launch, stored with its workload
    assert daemon.state.snapshot.workloads["w"].slices == (started.slice,)


def test_a_failed_node_kills_its_workers_and_the_workload_moves_to_the_spare_slice(daemon: Daemon, tmp_path: Path) -> None:
    create(daemon, tmp_path)
    (first,) = daemon.workers.live("w", daemon.state.snapshot.workloads["w"].seq)
    assert daemon.ask(rq.ChangeNodes(rq.NodeOperation.FAIL, (first.identity.node,))) == ("done", "")
    assert daemon.workers.killed == [first.id]  # at once: the hardware is gone
    moved = daemon.workers.started[-1]
    assert moved.attempt == 2 and moved.slice != first.identity.slice
    assert daemon.state.snapshot.nodes[first.identity.node].state.value == "Failed"


def test_a_repair_asks_for_the_nodes_gpus_to_be_judged_afresh(daemon: Daemon) -> None:
    assert daemon.ask(rq.ChangeNodes(rq.NodeOperation.CORDON, ("c-np-1-0",))) == ("done", "")
    assert daemon.ask(rq.ChangeNodes(rq.NodeOperation.UNCORDON, ("c-np-1-0",))) == ("done", "")
    assert daemon.health.repaired_nodes == ["c-np-1-0"]


def test_a_resize_commits_the_new_settings_then_resizes_the_spares(daemon: Daemon) -> None:
    asked = rq.ResizeCluster(2, warm_workers=3, warm_preload=("json",), hotswap=False, zygote=True)
    assert daemon.ask(asked) == ("done", "")
    expected = LocalSettings(warm_workers=3, warm_preload=("json",), hotswap=False, zygote=True)
    assert daemon.state.settings == expected and not daemon.state.config.hotswap
    assert LocalSettings.of(daemon.store.cluster().settings) == expected  # written with the round
    assert daemon.workers.spares == [(3, ("json",))] and daemon.workers.zygote == [True]


def test_requests_that_cannot_be_served_are_refused_and_change_nothing(daemon: Daemon, tmp_path: Path) -> None:
    before = daemon.state.snapshot
    assert daemon.ask(rq.DeleteWorkload("nope")) == ("rejected", "no workload named nope in cluster c")
    assert daemon.ask(rq.ChangeNodes(rq.NodeOperation.FAIL, ("c-np-9-0",))) == ("rejected", "no node named c-np-9-0 in cluster c")
    assert daemon.ask_row("node", {"op": "explode", "nodes": ["c-np-0-0"]}) == (
        "rejected", "refused: malformed node request: 'explode' is not a valid NodeOperation",
    )
    assert daemon.ask_row("create", {"spec": {"name": "w", "command": "x", "device_type": "v6e-4", "num_slices": 0}, "launch": {
        "environ": {}, "cwd": "/", "user_env": {}, "checkpoint_dir": str(tmp_path)}})[1].startswith("refused: --num-slices: ")
    assert daemon.state.snapshot is before and daemon.workers.started == []
    assert create(daemon, tmp_path, "big") == ("done", "")
    too_big = workload_spec(name="huge", command="x", device_type="v6e-4", num_slices=3)
    status, message = daemon.ask(rq.CreateWorkload(too_big, Launch({}, "/", str(tmp_path / "h"))))
    assert status == "rejected" and message.startswith("workload huge ")  # the core's rejection answers the create


def test_a_shutdown_stops_every_worker_and_refuses_what_comes_after(daemon: Daemon, tmp_path: Path) -> None:
    assert daemon.ask(rq.Shutdown()) == ("done", "stopping every worker")
    assert daemon.state.deleting and daemon.workers.stopped_everything and daemon.store.deleted()
    assert create(daemon, tmp_path) == ("rejected", "cluster c is being deleted")
    assert daemon.serving.work()  # every worker is gone: the controller's work is done


def test_worker_exits_become_the_core_events_of_the_next_round(daemon: Daemon, tmp_path: Path) -> None:
    create(daemon, tmp_path)
    (row,) = daemon.workers.live("w", daemon.state.snapshot.workloads["w"].seq)
    daemon.inbox.worker_exited(row, 42, None, attempt_over=True)
    who = row.identity
    assert daemon.inbox.events == [ev.WorkerExited("w", who.attempt, who.slice, who.host, 42), ev.WorkersStopped("w", who.attempt)]
    daemon.serving.work()  # no request: a round decides on them
    assert daemon.inbox.events == [] and daemon.state.snapshot.workloads["w"].restarts == 1  # 42: restart, charged
    lost = daemon.workers.started[-1]
    assert lost.attempt == 2
    (row,) = daemon.workers.live("w", lost.seq, lost.attempt)
    daemon.inbox.worker_exited(row, -9, "was lost", attempt_over=False)
    assert daemon.inbox.events == [ev.WorkerLost("w", lost.attempt, lost.slice, lost.host, "was lost")]


def test_a_node_the_gpu_monitor_fails_is_failed_by_the_next_round(daemon: Daemon, tmp_path: Path) -> None:
    create(daemon, tmp_path)
    (row,) = daemon.workers.live("w", daemon.state.snapshot.workloads["w"].seq)
    daemon.inbox.fail_nodes([(row.identity.node, "GPU 0: XID 79"), ("not-a-node", "ignored")])
    assert daemon.inbox.failed_nodes == {row.identity.node: "GPU 0: XID 79"}
    daemon.serving.work()
    assert daemon.workers.killed == [row.id] and daemon.inbox.failed_nodes == {}
    assert daemon.state.snapshot.nodes[row.identity.node].state.value == "Failed"


def test_a_round_without_a_request_decides_on_the_inbox(daemon: Daemon, tmp_path: Path) -> None:
    create(daemon, tmp_path)
    daemon.rounds.run(RoundInputs([ev.WorkloadDeleted("w")]))
    assert "w" not in daemon.state.snapshot.workloads and len(daemon.workers.stopped) == 1


def test_a_gpu_backed_resize_records_the_gpus_with_its_round_and_the_monitor_watches_them(paths: ClusterPaths) -> None:
    with LocalStore.open(paths.database, create=True) as store:
        store.init_cluster(ClusterRecord("c", "local", "local-gpu-1", 0.0, LocalSettings(backing=Backing(1)).to_settings()))
        daemon = Daemon(paths, store)
        assert daemon.ask(rq.ResizeCluster(2, gpus=(GpuInfo(0, "GPU-a", "H100"), GpuInfo(1, "GPU-b", "H100")))) == ("done", "")
        backing = daemon.state.backing
        assert backing is not None and [g.uuid for g in backing.gpus()] == ["GPU-a", "GPU-b"]
        assert daemon.health.watched == [backing] and LocalSettings.of(store.cluster().settings).backing == backing
        status, message = daemon.ask(rq.ResizeCluster(2, gpus=(GpuInfo(1, "GPU-b", "H100"),)))  # GPU-a's slice stays
        assert status == "rejected" and "GPU-a" in message
        assert daemon.state.backing == backing and daemon.health.watched == [backing]  # nothing changed
