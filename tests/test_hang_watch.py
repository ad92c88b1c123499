"""The local hang watcher (backends/local/controller/hangs.py) over events files it is handed: what counts
as a rank's history across attempts and elastic generations, saves, and half-written lines."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from builders import holding

from hotswap.api.worker_output import (
    EVENT_CHECKPOINT_BEGIN,
    EVENT_CHECKPOINT_SAVE,
    EVENT_ELASTIC,
    EVENT_STEP,
    EVENT_STOP,
    event_record,
)
from hotswap.backends.local import workload_files
from hotswap.backends.local.controller.hangs import CHECK_INTERVAL_S, HangWatch
from hotswap.core import events as ev
from hotswap.core.hang import FLOOR_S
from hotswap.core.model import Snapshot
from hotswap.store.paths import ClusterPaths
from hotswap.backends.local.tables import WorkerIdentity, WorkerRow


def row(worker_id: int, attempt: int = 1, replica: int = 0) -> WorkerRow:
    identity = WorkerIdentity("w", 0, attempt, f"s{replica}", replica, 0, f"s{replica}-0")
    return WorkerRow(worker_id, identity, "", 100 + worker_id, None, "running", None, 0.0, None, None, None)


class Rig:
    """One running workload "w" whose workers' events files this test writes."""

    def __init__(self, tmp_path: Path, per_host: int = 1, hang_timeout_s: float | None = None) -> None:
        self.paths = ClusterPaths("c", tmp_path / "c")
        self.rows = [row(1)]
        self.workload = holding("w", ("s0",), hang_timeout_s=hang_timeout_s)
        self.watch = HangWatch(self.paths, lambda w: self.rows, lambda: per_host)

    def events(self, worker: WorkerRow, local_rank: int = 0) -> Path:
        directory = self.paths.workload_dir("w", 0)
        who = worker.identity
        path = workload_files.local_events_path(workload_files.events_path(directory, who.attempt, who.replica, who.host, worker.id), local_rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def write(self, kind: str, t: float, worker: WorkerRow | None = None, local_rank: int = 0, end: str = "\n", **fields: object) -> None:
        with open(self.events(worker or self.rows[0], local_rank), "a") as handle:
            handle.write(event_record(kind, t, **fields) + end)

    def steps(self, first: int, last: int, start: float, every: float = 0.1, worker: WorkerRow | None = None) -> float:
        t = start
        for step in range(first, last + 1):
            self.write(EVENT_STEP, t, worker, step=step, duration_s=every)
            t += every
        return t - every

    def check(self, now: float) -> list[ev.Event]:
        self.watch.checked_at = now - CHECK_INTERVAL_S  # a look is due
        return self.watch.check(Snapshot.build(now, workloads=[self.workload]), now)


def test_a_stalled_rank_is_reported_once_per_attempt(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert rig.check(1.0) == []  # watching from t=1
    last = rig.steps(1, 20, 2.0)
    assert rig.check(last + 8.0) == []  # an evaluation-like pause
    assert rig.check(last + FLOOR_S - 1) == []
    (hang,) = rig.check(last + FLOOR_S + 1)
    assert isinstance(hang, ev.WorkloadHung) and (hang.workload, hang.attempt) == ("w", 1) and "step 20" in hang.reason
    assert rig.check(last + FLOOR_S + 9.0) == []  # reported once
    # The next attempt starts a new history in new workload_files.
    rig.workload = dataclasses.replace(rig.workload, attempt=2, running_since=last + 10.0)
    rig.rows = [row(2, attempt=2)]
    assert rig.check(last + 30.0) == []  # no step of attempt 2 yet: a slow first step
    later = rig.steps(1, 3, last + 31.0, worker=rig.rows[0])
    assert len(rig.check(later + FLOOR_S + 1)) == 1


def test_saves_and_cut_lines(tmp_path: Path) -> None:
    rig = Rig(tmp_path, hang_timeout_s=4.0)
    rig.check(0.5)
    last = rig.steps(1, 10, 1.0)
    rig.write(EVENT_CHECKPOINT_BEGIN, last + 0.1, step=10, reason="periodic")
    assert rig.check(last + 30.0) == []  # a first save may take long
    rig.write(EVENT_CHECKPOINT_SAVE, last + 31.0, step=10, blocking_s=30.9, total_s=30.9, bytes=1, reason="periodic")
    rig.write(EVENT_STEP, last + 31.1, end="", step=11)  # cut short by a kill: not read yet
    assert rig.check(last + 33.0) == []
    assert len(rig.check(last + 36.0)) == 1  # nothing since the save ended (11 never finished its line)


def test_after_an_elastic_change_a_survivors_history_starts_when_it_joins(tmp_path: Path) -> None:
    rig = Rig(tmp_path, hang_timeout_s=4.0)
    rig.check(0.5)
    last = rig.steps(1, 30, 1.0)
    rig.check(last + 0.1)
    rig.workload = dataclasses.replace(rig.workload, membership=1)  # a slice was lost: re-forming
    assert rig.check(last + 0.5) == []
    assert rig.check(last + 60.0) == []  # re-forming takes long: no history in the new generation
    rig.write(EVENT_ELASTIC, last + 61.0, generation=2, slices=1, duration_s=60.0)
    again = rig.steps(31, 35, last + 61.5)
    assert rig.check(again + 2.0) == []
    assert len(rig.check(again + 5.0)) == 1


def test_every_local_process_of_a_gpu_host_is_a_rank(tmp_path: Path) -> None:
    rig = Rig(tmp_path, per_host=2, hang_timeout_s=4.0)
    rig.check(0.5)
    for local_rank in (0, 1):
        for step in range(1, 11):
            rig.write(EVENT_STEP, 1.0 + step * 0.1, local_rank=local_rank, step=step, duration_s=0.1)
    rig.write(EVENT_STEP, 2.1, local_rank=0, step=11, duration_s=0.1)  # local rank 1 stopped at step 10
    (hang,) = rig.check(6.1)
    assert "rank s0/0.1" in hang.reason


def test_the_limit_set_with_hang_timeout_is_kept_above_the_floor(tmp_path: Path) -> None:
    rig = Rig(tmp_path, hang_timeout_s=FLOOR_S * 2)
    rig.check(0.5)
    last = rig.steps(1, 20, 1.0)
    assert rig.check(last + FLOOR_S * 2 - 1) == []
    (hang,) = rig.check(last + FLOOR_S * 2 + 1)
    assert "--hang-timeout" in hang.reason


def test_a_rank_that_recorded_its_stop_or_writes_its_last_save_is_leaving(tmp_path: Path) -> None:
    rig = Rig(tmp_path, hang_timeout_s=4.0)
    other = row(2, replica=1)
    rig.rows.append(other)
    rig.check(0.5)
    last = rig.steps(1, 20, 1.0)
    rig.steps(1, 20, 1.0, worker=other)
    rig.write(EVENT_STOP, last + 0.1, step=20, reason="complete", exit_code=0)  # rank 0: its exit may be slow
    rig.write(EVENT_CHECKPOINT_BEGIN, last + 0.1, other, step=20, reason="final")  # rank 1: its final save
    assert rig.check(last + 1000.0) == []
    # A rank stepping again (a process that goes on after a handover) is judged again.
    rig.write(EVENT_STEP, last + 1000.0, other, step=21, duration_s=0.1)
    assert rig.check(last + 1003.0) == []
    (hang,) = rig.check(last + 1005.0)
    assert "rank s1/0" in hang.reason and "step 21" in hang.reason


def test_a_periodic_save_is_still_judged_by_its_allowance(tmp_path: Path) -> None:
    rig = Rig(tmp_path, hang_timeout_s=4.0)
    rig.check(0.5)
    last = rig.steps(1, 10, 1.0)
    rig.write(EVENT_CHECKPOINT_BEGIN, last + 0.1, step=10, reason="periodic")
    rig.write(EVENT_CHECKPOINT_SAVE, last + 2.0, step=10, blocking_s=1.9, total_s=1.9, bytes=1, reason="periodic")
    again = rig.steps(11, 20, last + 2.1)
    rig.write(EVENT_CHECKPOINT_BEGIN, again + 0.1, step=20, reason="periodic")
    assert rig.check(again + 9.0) == []  # 5 x the longest save (1.9 s)
    (hang,) = rig.check(again + 10.0)
    assert "a checkpoint save announced" in hang.reason
