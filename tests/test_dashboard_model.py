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


def test_a_failure_then_a_restart_then_progress_is_one_recovery_with_its_mttr() -> None:
    history = History()
    log = b""

    def look(now: float, lines: list[str], timeline: list[dict[str, Any]]) -> None:
        nonlocal log
        log += "".join(line + "\n" for line in lines).encode()
        history.take_timeline("w", timeline, now, live=True)
        history.take_log("w", log, now)

    admitted = [{"time": "2026-11-23T10:00:00Z", "event": "admit", "message": "admitted"}]
    look(100.0, ["step=1 elastic_manager.good_slice_count=1 elastic_manager.elastic_down_event_count=0"], admitted)
    look(101.0, ["step=3 x=1"], admitted)
    failed = admitted + [{"time": "t", "event": "node", "message": "node s0-0 failed"},
                         {"time": "t", "event": "restart", "message": "restarted on s1"}]
    look(102.0, ["step=4 x=1"], failed)  # the old workers' last line, read in the look that saw the restart
    assert history.workloads["w"].recoveries == []
    look(103.5, ["restored step=3 source=checkpoint"], failed)  # restored, not yet a step
    assert history.workloads["w"].recoveries == []
    look(104.5, ["step=4 x=1"], failed)
    kept = history.workloads["w"]
    assert kept.recoveries == [2.5] and kept.mttr_s == 2.5
    assert [m["kind"] for m in kept.marks] == ["failure", "recovery"]
    assert [e["category"] for e in history.events] == ["admission", "failure", "hotswap", "checkpoint"]
    assert kept.step == 4


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
                                {"event": "restart", "message": "restarted (attempt 2)"}], 1_700_000_070.0, live=True)
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
    history.take_timeline("w", [{"event": "node", "message": "node failed"}, {"event": "restart", "message": "restarted"}], 1.0, live=True)
    # Thousands of admissions and saves alternating, so that none merge: both caps are overrun.
    for i in range(3000):
        history.take_timeline(f"r{i}", [{"event": "admit", "message": "admitted"}], 2.0 + i, live=True)
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
