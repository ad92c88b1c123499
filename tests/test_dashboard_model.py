"""The dashboard's page model and history: pure, no server, no processes."""

from __future__ import annotations

import json
from typing import Any

from hotswap.api.errors import StateError
from hotswap.dashboard import model
from hotswap.dashboard.history import History
from hotswap.dashboard.source import ClusterSource


def row(name: str, status: str = "RUNNING", priority: str = "medium", created: str = "2026-11-23T10:00:00Z", **extra: Any) -> dict[str, Any]:
    return {"name": name, "priority": priority, "status": status, "status_message": extra.pop("message", f"{status.lower()}"),
            "status_time": created, "created_time": created, "slices": extra.pop("slices", []), "num_slices": 1,
            "restarts": 0, "preemptions": 0, **extra}


def test_the_queue_is_ordered_by_priority_then_fifo_with_the_reason_each_waits() -> None:
    rows = [
        row("late-high", "QUEUED", "high", "2026-11-23T10:00:05Z", message="queued: waiting for 2 slice(s) of v6e-4"),
        row("early-low", "QUEUED", "low", "2026-11-23T10:00:01Z", message="queued: waiting for 1 slice(s) of v6e-4"),
        row("early-high", "QUEUED", "high", "2026-11-23T10:00:02Z", message="preempted by urgent; waiting"),
        row("running", "RUNNING", "very-high"),
    ]
    queue = model.queue_order(rows)
    assert [q["name"] for q in queue] == ["early-high", "late-high", "early-low"]
    assert [q["position"] for q in queue] == [1, 2, 3]
    assert queue[0]["reason"] == "preempted by urgent; waiting"


def test_node_health_names_a_gpu_fault_only_on_gpu_backed_slices() -> None:
    xid = {"name": "n", "state": "Failed", "reason": "GPU 0: XID 79 (fallen off the bus)"}
    assert model.node_health(xid, gpu_backed=True) == "GPU unhealthy"
    assert model.node_health(xid, gpu_backed=False) == "Failed"
    assert model.node_health({"name": "n", "state": "Failed", "reason": "hotswap node fail"}, gpu_backed=True) == "Failed"
    assert model.node_health({"name": "n", "state": "Cordoned"}, gpu_backed=True) == "Cordoned"


def test_the_slices_grid_counts_held_spare_and_unhealthy_capacity() -> None:
    cluster = {"backing": "emulated", "warm_workers": 1, "slices": [
        {"name": "s0", "workload": "a", "healthy": True, "nodes": [{"name": "s0-0", "state": "Ready"}]},
        {"name": "s1", "workload": None, "healthy": True, "nodes": [{"name": "s1-0", "state": "Ready"}]},
        {"name": "s2", "workload": None, "healthy": False, "nodes": [{"name": "s2-0", "state": "Failed", "reason": "hotswap node fail"}]},
    ]}
    grid, counts = model.slices_grid(cluster)
    assert [(s["name"], s["kind"], s["holder"]) for s in grid] == [("s0", "held", "a"), ("s1", "spare", None), ("s2", "unhealthy", None)]
    assert counts == {"held": 1, "spare": 1, "unhealthy": 1}
    assert grid[2]["nodes"][0] == {"name": "s2-0", "health": "Failed", "reason": "hotswap node fail"}


def test_environment_values_never_reach_the_page_only_their_names() -> None:
    secret = "s3cr3t-value-that-must-not-leak"
    described = {"w": {"spec": {"env": {"WANDB_API_KEY": secret}}, "launch": {"environ": {"AWS_SECRET": secret}},
                       "goodput": {"goodput": 0.5, "wall_s": 10, "badput": {"queued": 0.5, "startup": 0.0}}}}
    page = model.page({"name": "c", "slices": []}, [row("w")], described, History(), updated=1.0, now=1.5, error=None, stale_after_s=3)
    text = json.dumps(page)
    assert secret not in text
    (workload,) = page["workloads"]
    assert workload["env_names"] == ["WANDB_API_KEY"]
    assert workload["badput"] == {"queued": 0.5}  # only what was lost
    assert workload["xpk_status"] == model.status_words(row("w")) == "Admitted · RUNNING"  # xpk's words, then ours
    assert model.status_words(row("q", "QUEUED", message="queued: waiting for 1 slice(s) of v6e-4")).startswith("QuotaReserved")
    assert model.status_words(row("s", "SUCCESSFUL", message="")) == "Finished · SUCCESSFUL"


def test_mttr_and_times_are_the_records_not_when_the_dashboard_looked() -> None:
    """Issue 34 (2, 3): a sub-second recovery that happened before the dashboard started showed
    450.8 s (timed to its first look), and a restore read from the log was listed at the time it
    was seen, after the failure that followed it. Now each is the backend's record."""
    history = History()
    timeline = [{"time": "2026-11-23T10:00:00Z", "event": "admit", "message": "admitted"},
                {"time": "2026-11-23T10:00:10Z", "event": "node", "message": "node s0-0 failed"},
                {"time": "2026-11-23T10:00:10Z", "event": "restart", "message": "restarted on s1"}]
    exact = [1_700_000_000.0, 1_700_000_010.617, 1_700_000_010.650]
    progress = {"mttr_s": 0.44, "timeline_t": exact,
                "recoveries": [{"failed_at": 1_700_000_010.617, "recovered_at": 1_700_000_011.057, "seconds": 0.44}],
                "restores": [{"t": 1_700_000_010.400, "step": 3, "source": "peer", "attempt": 1},
                             {"t": 1_700_000_011.000, "step": 9, "source": "checkpoint", "attempt": 2}],
                "steps": [[1_700_000_010.500, 9], [1_700_000_011.057, 10], [1_700_000_011.157, 11]],
                "saves": [[1_700_000_009.0, 0.5]]}
    described = {"w": {"timeline": timeline, "progress": progress, "goodput": {"source": "workers", "goodput": 0.8, "wall_s": 12.0, "badput": {}}}}
    history.take_timeline("w", timeline, exact)
    history.take_progress("w", progress)
    looked = 1_700_001_000.0  # the dashboard's first look, long after
    page = model.page({"name": "c", "slices": []}, [row("w")], described, history, updated=looked, now=looked, error=None, stale_after_s=3)
    (workload,) = page["workloads"]
    assert workload["mttr_s"] == 0.44  # the records' figure, never looked - 1_700_000_010.617
    assert [(e["t"], e["kind"]) for e in page["events"]] == [
        (1_700_000_000.0, "admit"), (1_700_000_009.0, "checkpoint"), (1_700_000_010.4, "restored"),
        (1_700_000_010.617, "node"), (1_700_000_010.65, "restart"), (1_700_000_011.0, "restored")]
    assert page["marks"]["w"] == [{"t": 1_700_000_010.617, "kind": "failure"}, {"t": 1_700_000_011.057, "kind": "recovery"}]
    assert workload["step"] == 11 and abs(workload["steps_per_s"] - 2 / 0.657) < 1e-6  # from the steps' own times
    # The same records read again (the next look) add nothing.
    history.take_timeline("w", timeline, exact)
    history.take_progress("w", progress)
    assert len(history.events) == 6 and len(history.workloads["w"].steps) == 3


def test_a_backend_without_recorded_progress_shows_no_mttr_rather_than_its_own_clock() -> None:
    """Kubernetes keeps the workers' events in their pods: the page says unknown ("–"), it does
    not time a failure from when it saw it; a restored line of the log makes no row."""
    history = History()
    failed = [{"time": "2026-11-23T10:00:10Z", "event": "node", "message": "node s0-0 failed"},
              {"time": "2026-11-23T10:00:11Z", "event": "restart", "message": "restarted on s1"}]
    history.take_timeline("w", failed)
    history.take_log("w", b"restored step=3 source=checkpoint\nstep=4 x=1\n", 5000.0)
    kept = history.workloads["w"]
    assert kept.mttr_s is None and kept.step == 4
    assert [e["t"] for e in history.events] == [model_epoch("2026-11-23T10:00:10Z"), model_epoch("2026-11-23T10:00:11Z")]
    assert [e["kind"] for e in history.events] == ["node", "restart"]


def model_epoch(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_job_that_never_reported_a_step_shows_goodput_unknown_with_the_reason() -> None:
    """Issue 34 (4): "startup 100 %" for `echo hello`, and a hover text saying the opposite of
    the figure. The page gets unknown and the backend's reason, and no startup charge."""
    reason = "its workers reported no training step (none completed, or the command does not use hotswap.train)"
    plain = {"source": "controller", "goodput": 0.0, "wall_s": 5.0, "badput": {"startup": 1.0}, "reason": reason}
    trained = {"source": "workers", "goodput": 0.75, "wall_s": 5.0, "badput": {"startup": 0.25}}
    page = model.page({"name": "c", "slices": []}, [row("plain"), row("trained")], {"plain": {"goodput": plain}, "trained": {"goodput": trained}},
                      History(), updated=1.0, now=1.5, error=None, stale_after_s=3)
    by_name = {w["name"]: w for w in page["workloads"]}
    assert by_name["plain"]["goodput"] is None and by_name["plain"]["goodput_unknown"] is True
    assert by_name["plain"]["goodput_reason"] == reason and by_name["plain"]["badput"] == {}
    assert by_name["trained"]["goodput"] == 0.75 and by_name["trained"]["goodput_unknown"] is False
    assert by_name["trained"]["badput"] == {"startup": 0.25}


def test_steps_per_second_uses_recent_uninterrupted_progress() -> None:
    history = History()
    text = ""
    for i, t in enumerate([0.0, 1.0, 2.0, 3.0]):
        text += f"step={10 * i}\n"
        history.take_log("w", text.encode(), t)
    assert history.workloads["w"].steps_per_s() == 10.0
    text += "step=5\n"  # restored from an older checkpoint: the rate starts over
    history.take_log("w", text.encode(), 4.0)
    assert history.workloads["w"].steps_per_s() is None


def test_a_log_cut_mid_line_is_read_once_the_line_is_complete() -> None:
    history = History()
    history.take_log("w", b"step=7 elastic_manager.good", 1.0)
    assert history.workloads["w"].step is None
    history.take_log("w", b"step=7 elastic_manager.good_slice_count=1\n", 2.0)
    assert history.workloads["w"].step == 7


class FlakyBackend:
    """A backend that answers, then cannot be reached (an API server gone), then answers."""

    name = "fake"

    def __init__(self) -> None:
        self.reachable = True

    def _check(self) -> None:
        if not self.reachable:
            raise StateError("cannot reach the Kubernetes API server at https://10.0.0.1: connection refused")

    def describe_cluster(self, cluster: str) -> dict[str, Any]:
        self._check()
        return {"name": cluster, "backend": "kubernetes", "slices": [{"name": "s0", "workload": "w", "healthy": True, "nodes": []}]}

    def list_workloads(self, cluster: str, status: str, prefix: str | None) -> list[dict[str, Any]]:
        self._check()
        return [row("w", slices=["s0"])]

    def describe_workload(self, cluster: str, name: str) -> dict[str, Any]:
        self._check()
        return {"timeline": [], "goodput": {"goodput": 0.9, "wall_s": 10.0, "badput": {}}}

    def logs(self, cluster: str, name: str, slice_: Any, host: int, follow: bool, write: Any) -> None:
        write(b"step=5\n")


def test_an_unreachable_cluster_keeps_the_last_data_marked_stale_with_one_line() -> None:
    backend = FlakyBackend()
    source = ClusterSource("c", lambda: backend, interval_s=0.1)
    source.look()
    _, text = source.snapshot()
    first = json.loads(text)
    assert not first["stale"] and first["error"] is None and first["slices"][0]["holder"] == "w"
    backend.reachable = False
    source.look()
    version, text = source.snapshot()
    stale = json.loads(text)
    assert stale["stale"] and stale["error"].startswith("cannot reach the Kubernetes API server")
    assert "\n" not in stale["error"]
    assert stale["slices"] == first["slices"] and stale["workloads"][0]["step"] == 5  # the last data, kept
    assert version > first["version"]
    backend.reachable = True
    source.look()
    assert json.loads(source.snapshot()[1])["stale"] is False


def test_checkpoint_saves_appear_when_the_ledger_s_save_time_grows() -> None:
    history = History()
    history.take_saves("w", {"slice_seconds": {"checkpoint_save": 0.0}}, 1.0)
    history.take_saves("w", {"slice_seconds": {"checkpoint_save": 0.0}}, 2.0)
    assert history.events == []
    history.take_saves("w", {"slice_seconds": {"checkpoint_save": 0.25}}, 3.0)
    assert [(e["t"], e["category"], e["message"]) for e in history.events] == [
        (3.0, "checkpoint", "checkpoint saved (0.25 slice-s of saving)")
    ]


def _saves(history: History, name: str, times: list[float], start: float = 0.0) -> float:
    """A save every listed second, 0.1 slice-s each (the ledger's total grows by 0.1)."""
    total = start
    for t in times:
        total += 0.1
        history.take_saves(name, {"slice_seconds": {"checkpoint_save": total}}, t)
    return total


def test_periodic_checkpoint_saves_are_one_line_a_run_and_failures_split_them() -> None:
    # 1700000000 is 22:13:20 UTC.
    history = History()
    history.take_saves("w", {"slice_seconds": {"checkpoint_save": 0.0}}, 1_700_000_000.0)
    total = _saves(history, "w", [1_700_000_000.0 + 3 * i for i in range(1, 21)])  # every 3 s for a minute
    history.take_saves("other", {"slice_seconds": {"checkpoint_save": 0.0}}, 1_700_000_000.0)
    _saves(history, "other", [1_700_000_001.0])  # another workload's entries do not break w's run
    history.take_timeline("w", [{"event": "node", "message": "node c-np-0-0 failed"},
                                {"event": "restart", "message": "restarted (attempt 2)"}], [1_700_000_070.0, 1_700_000_070.0])
    _saves(history, "w", [1_700_000_073.0, 1_700_000_076.0], start=total)
    page = model.page({"name": "c", "slices": []}, [row("w")], {}, history, updated=1.0, now=1.5, error=None, stale_after_s=3)
    lines = [(e["workload"], e["category"], e["message"]) for e in page["events"] if e["workload"] == "w"]
    assert lines == [
        ("w", "checkpoint", "checkpoint saved ×20 from 22:13:23 to 22:14:20 (2.00 slice-s of saving)"),
        ("w", "failure", "node c-np-0-0 failed"),
        ("w", "hotswap", "restarted (attempt 2)"),
        ("w", "checkpoint", "checkpoint saved ×2 from 22:14:33 to 22:14:36 (0.20 slice-s of saving)"),
    ]
    assert [e["count"] for e in page["events"] if e["category"] == "checkpoint"] == [1, 20, 2]  # other's, then w's


def test_no_amount_of_routine_entries_pushes_a_failure_or_a_restart_out() -> None:
    history = History()
    history.take_timeline("w", [{"event": "node", "message": "node failed"}, {"event": "restart", "message": "restarted"}], [1.0, 1.0])
    # Thousands of admissions and saves alternating, so that none merge: both caps are overrun.
    for i in range(3000):
        history.take_timeline(f"r{i}", [{"event": "admit", "message": "admitted"}], [2.0 + i])
    assert [e["message"] for e in history.events if e["category"] in ("failure", "hotswap")] == ["node failed", "restarted"]
    page = model.page({"name": "c", "slices": []}, [row("w")], {}, history, updated=1.0, now=1.5, error=None, stale_after_s=3)
    assert len(page["events"]) == model.PAGE_EVENTS
    assert [e["message"] for e in page["events"][:2]] == ["node failed", "restarted"]  # still shown, oldest first
    assert page["events"][-1]["workload"] == "r2999"  # and the newest routine ones fill the rest


def test_a_queued_or_restarting_workload_shows_no_rate() -> None:
    history = History()
    history.take_log("w", b"step=1\n", 1.0)
    history.take_log("w", b"step=1\nstep=11\n", 2.0)
    for status, rate in (("RUNNING", 10.0), ("QUEUED", None), ("RESTARTING", None), ("FAILED", None)):
        page = model.page({"name": "c", "slices": []}, [row("w", status)], {}, history, updated=1.0, now=1.5, error=None, stale_after_s=3)
        (workload,) = page["workloads"]
        assert workload["steps_per_s"] == rate, status
        assert workload["step"] == 11  # the last step stays: it is where the workload is


class ComingBackend(FlakyBackend):
    """A cluster not created yet, then half created (its database without tables), then there."""

    def __init__(self) -> None:
        super().__init__()
        self.stage = "absent"

    def _check(self) -> None:
        from hotswap.api.errors import NotFoundError

        if self.stage == "absent":
            raise NotFoundError("no cluster named c: create it with `hotswap cluster create --cluster c`")
        if self.stage == "creating":
            raise StateError("the database /x/state.db holds no hotswap tables")


def test_the_source_survives_a_cluster_created_corrupted_and_deleted_under_it_saying_what_it_waits_for() -> None:
    """Issue 34 (6): the page's data thread died on CorruptState raised during cluster creation,
    again inside its handler (the demo's log reads the registry), and said "no cluster" for the
    whole drill. Now no look and no report ends the thread, and the page says what it waits for."""
    import threading

    backend = ComingBackend()
    reports: list[str] = []

    def log(line: str) -> None:  # like the demo's: reading a half-created cluster raises
        if backend.stage == "creating":
            raise StateError("the database /x/state.db holds no hotswap tables")
        reports.append(line)

    source = ClusterSource("c", lambda: backend, interval_s=0.01, log=log)
    source.start()
    try:
        def document() -> dict[str, Any]:
            return json.loads(source.snapshot()[1])

        assert document()["waiting_for"] == "cluster c to be created" and document()["stale"]
        backend.stage = "creating"
        looks = source.looks
        _until(lambda: source.looks > looks + 3)
        assert document()["waiting_for"] == "cluster c to be readable again"
        assert source._thread is not None and source._thread.is_alive()
        backend.stage = "ready"
        _until(lambda: not document()["stale"])
        assert document()["waiting_for"] is None and document()["slices"][0]["holder"] == "w"
        backend.stage = "absent"  # deleted under it
        _until(lambda: document()["error"] is not None)
        assert document()["waiting_for"] == "cluster c to exist again (deleted?)"
        assert threading.active_count() >= 1 and source._thread.is_alive()
    finally:
        source.stop()
    assert any("readable again" in line for line in reports)


def _until(condition: Any, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
