"""The demo's drills: real PyTorch training on a fresh local cluster, real faults, real recovery.

Each drill creates its own cluster (a unique name), runs the SDK example on it, injects the
faults the seeds describe, measures from the training processes' own records, checks what
must hold, and removes the cluster and its checkpoints (``keep`` leaves everything for
inspection).
"""

from __future__ import annotations

import abc
import dataclasses
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from hotswap.api.spec import workload_spec
from hotswap.backends.base import launch_record
from hotswap.backends.local import client, operations
from hotswap.backends.local.launch import log_path
from hotswap.backends.local.protocol import RequestKind
from hotswap.demo.observe import Trace, log_lines, read_trace, slice_count_changes
from hotswap.demo.view import DemoView
from hotswap.store import registry
from hotswap.store.paths import home
from hotswap.store.state import LIVE_WORKER_STATES, Store

DEVICE = "v6e-4"  # one host per slice: one training process per slice on a laptop
REPAIR_BASELINE_S = 600.0  # GKE's node repair, what a job waits without hotswap


# Controller decisions worth showing as they happen (node faults appear as the drill's own lines).
_SHOWN = {"admit", "preempt", "restart", "startworkers", "requeue", "scaledown", "scaleup", "fail", "complete"}


class DrillFailed(Exception):
    """The drill could not go on (a wait timed out); the summary reports it as failed."""


def example_script(name: str) -> Path:
    """A training script shipped with hotswap (``examples/`` in the repository)."""
    return Path(str(resources.files("hotswap.examples") / name))


@dataclasses.dataclass
class Check:
    name: str
    passed: bool
    detail: str


@dataclasses.dataclass
class DemoOptions:
    keep: bool = False
    step_sleep: float = 0.05  # seconds per training step: slow enough to watch
    warm: bool = True  # also measure a failover onto warm spare workers
    timeout_s: float = 90.0  # for any single wait


class Drill(abc.ABC):
    scenario = ""
    title = ""

    def __init__(self, options: DemoOptions, live: bool | None = None) -> None:
        self.options = options
        self.cluster = f"demo-{self.scenario}-{secrets.token_hex(2)}"
        self.checks: list[Check] = []
        self.marks: list[dict[str, Any]] = []  # failures and repairs, for the plot
        self.started = time.time()
        self.view = DemoView(f"hotswap demo {self.scenario}: {self.title}", self._state, live)
        self._seen_event = 0  # the controller's timeline, shown as it grows
        self.workdir = Path.cwd()

    # ------------------------------------------------------------------ plumbing

    def _state(self) -> dict[str, Any]:
        try:
            cluster = operations.describe_cluster(self.cluster)
        except Exception:  # the cluster is being created or removed
            return {}
        jobs = []
        for job in operations.list_workloads(self.cluster):
            trace = self.trace(job["name"])
            jobs.append({**job, "step": trace.last_step if trace else None, "loss": trace.latest_loss() if trace else None})
        return {"slices": cluster["slices"], "jobs": jobs}

    def event(self, message: str) -> None:
        self.view.event(message)

    def check(self, name: str, passed: bool, detail: str) -> bool:
        self.checks.append(Check(name, bool(passed), detail))
        self.event(f"{'PASS' if passed else 'FAIL'} {name}: {detail}")
        return passed

    def wait(self, what: str, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout or self.options.timeout_s)
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise DrillFailed(f"timed out waiting for {what}")
            self._fail_fast()
            self._follow_controller()
            self.view.refresh()
            time.sleep(0.05)

    def _follow_controller(self) -> None:
        """Show the controller's decisions as they are committed (admissions, preemptions, ...)."""
        try:
            store = Store.open(registry.existing(self.cluster).database)
        except Exception:
            return
        try:
            rows = store.events_after(self._seen_event)
        finally:
            store.close()
        for row in rows:
            self._seen_event = row["id"]
            if row["kind"] in _SHOWN and row["workload"]:
                self.view.event(f"  controller: {row['workload']} {row['message']}")

    def _fail_fast(self) -> None:
        """A training job that failed will not recover: stop waiting and show why."""
        for job in operations.list_workloads(self.cluster, "FAILED"):
            directory = self.workload_dir(job["name"])
            tail = log_lines(log_path(directory, 0, 0))[-8:] if directory else []
            raise DrillFailed(f"{job['name']} failed: {job['status_message']}; its log ends:\n" + "\n".join(tail))

    def create_cluster(self, slices: int, warm: int = 0) -> None:
        operations.create_cluster(self.cluster, DEVICE, slices, True, lambda _: True, warm_workers=warm)
        self.event(f"cluster {self.cluster}: {slices} x {DEVICE} (1 host per slice), controller started")

    def submit(self, name: str, *, priority: str, slices: int, steps: int = 1_000_000, script: str = "train.py", **flags: Any) -> None:
        command = (
            f"{sys.executable} {example_script(script)} --steps {steps} --step-sleep {self.options.step_sleep}"
            f" --checkpoint-every 50"
        )
        spec = workload_spec(
            name=name, command=command, device_type=DEVICE, num_slices=slices, priority=priority,
            termination_grace_period_s=20.0, max_restarts=3, **flags,
        )
        launch = launch_record(
            environ=dict(os.environ), cwd=str(self.workdir), user_env={"OMP_NUM_THREADS": "1"},
            checkpoint_dir=str(registry.existing(self.cluster).checkpoint_dir(name)),
        )
        view = operations.create_workload(self.cluster, spec, launch)
        self.event(f"{name} ({priority}, {slices} slice(s)) submitted: {view['status']} on {', '.join(view['slices']) or '-'}")

    def record(self, name: str) -> dict[str, Any] | None:
        return next((w for w in operations.list_workloads(self.cluster) if w["name"] == name), None)

    def workload_dir(self, name: str) -> Path | None:
        paths = registry.existing(self.cluster)
        with Store.open(paths.database) as store:
            seq = next((r["seq"] for r, _ in store.workload_records() if r["spec"]["name"] == name), None)
        return None if seq is None else paths.workload_dir(name, seq)

    def trace(self, name: str) -> Trace | None:
        directory = self.workload_dir(name)
        return read_trace(directory) if directory else None

    def steps_of(self, name: str) -> int:
        trace = self.trace(name)
        return trace.last_step if trace else 0

    def wait_steps(self, name: str, at_least: int) -> None:
        self.wait(f"{name} to reach step {at_least}", lambda: self.steps_of(name) >= at_least)

    def node(self, operation: str, node: str) -> float:
        paths = registry.existing(self.cluster)
        t = time.time()
        outcome = client.request(paths, RequestKind.NODE, {"op": operation, "nodes": [node]})
        if outcome.status != "done":
            raise DrillFailed(outcome.message)
        self.marks.append({"t": t, "what": operation, "node": node})
        self._follow_controller()
        return t

    def main_log(self, name: str) -> Path:
        directory = self.workload_dir(name)
        assert directory is not None
        return log_path(directory, 0, 0)

    def goodput(self, name: str) -> dict[str, Any]:
        return operations.describe_workload(self.cluster, name)["goodput"]

    def timeline(self) -> list[dict[str, Any]]:
        paths = registry.existing(self.cluster)
        with Store.open(paths.database) as store:
            return [dict(r) for r in store.timeline()]

    def cleanup(self) -> None:
        if self.options.keep:
            self.event(f"kept cluster {self.cluster} (delete it with `hotswap cluster delete --cluster {self.cluster}`)")
            return
        try:
            checkpoints = registry.existing(self.cluster).checkpoint_dir("x").parent
            operations.delete_cluster(self.cluster)
            shutil.rmtree(checkpoints, ignore_errors=True)
            self.event(f"cluster {self.cluster} deleted")
        except Exception as error:  # report, never mask the drill's own outcome
            self.event(f"cleanup of {self.cluster} failed: {error}")

    # ------------------------------------------------------------------ running

    def run(self) -> dict[str, Any]:
        summary: dict[str, Any] = {"scenario": self.scenario, "cluster": self.cluster}
        with self.view:
            try:
                summary.update(self.drill())
            except DrillFailed as error:
                self.check("drill completed", False, str(error))
            finally:
                summary["timeline"] = self._safe_timeline()
                summary["marks"] = self.marks
                summary["progress"] = self._safe_progress()
                if not self.options.keep:
                    self._archive(summary)
                self.cleanup()
        summary["checks"] = [dataclasses.asdict(c) for c in self.checks]
        summary["passed"] = bool(self.checks) and all(c.passed for c in self.checks)
        summary["wall_s"] = round(time.time() - self.started, 1)
        summary.setdefault("mttr_s", None)
        summary.setdefault("steps_lost", None)
        summary.setdefault("preempted", [])
        summary.setdefault("logs", None)
        return summary

    def _archive(self, summary: dict[str, Any]) -> None:
        """Keep the training logs and goodput events of a drill whose cluster is removed
        (``<state>/demo-runs/<cluster>/``); the summary's paths point there."""
        try:
            source = registry.existing(self.cluster).root / "workloads"
        except Exception:
            return
        target = home() / "demo-runs" / self.cluster
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("workers", "membership.*"), dirs_exist_ok=True)
        for key in ("logs",):
            if summary.get(key):
                summary[key] = str(summary[key]).replace(str(source), str(target))
        summary["archive"] = str(target)

    def _safe_progress(self) -> dict[str, list[tuple[float, int]]]:
        """Each job's (time, step) as its rank 0 reported them, thinned to a few hundred points."""
        progress: dict[str, list[tuple[float, int]]] = {}
        try:
            names = {w["name"] for w in operations.list_workloads(self.cluster)}
        except Exception:
            return progress
        for name in sorted(names):
            trace = self.trace(name)
            if trace is None:
                continue
            points = [(s.t, s.step) for s in trace.steps if s.replica == 0 and s.host == 0] or [(s.t, s.step) for s in trace.steps]
            stride = max(1, len(points) // 400)
            progress[name] = points[::stride]
        return progress

    def _safe_timeline(self) -> list[dict[str, Any]]:
        try:
            return self.timeline()
        except Exception:
            return []

    @abc.abstractmethod
    def drill(self) -> dict[str, Any]:
        """Run the scenario; return its part of the summary (checks go through ``check``)."""


class HotswapDrill(Drill):
    """Seed 000: a failed node under the high-priority job moves it onto the low job's slice."""

    scenario = "hotswap"
    title = "a failed node moves the high-priority job onto the low-priority job's slice"

    def failover(self, label: str) -> dict[str, Any]:
        high = self.record("high")
        low = self.record("low")
        assert high is not None and low is not None
        low_slice = low["slices"][0]
        failed_node = f"{high['slices'][0]}-0"
        self.event(f"failing node {failed_node} under high ({label} restart)")
        t_fail = self.node("fail", failed_node)
        # Recovery ends at the first step of the new attempt, as its workers logged it.
        after = self.wait("high to train again", lambda: self._first_step_of_attempt_after("high", high["attempt"]))
        mttr = after.t - t_fail
        trace = self.trace("high")
        assert trace is not None
        restored = next((r for r in trace.restores if r.attempt > high["attempt"]), None)
        done_before = max((s.step for s in trace.steps if s.attempt <= high["attempt"]), default=0)
        high_now, low_now = self.record("high"), self.record("low")
        self.event(f"high trains again at step {after.step}, {mttr:.2f}s after the failure; low: {low_now['status']}")
        self.check(
            f"{label}: high moved onto low's slice at once (no repair)",
            low_slice in high_now["slices"],
            f"high on {', '.join(high_now['slices'])}, low's slice was {low_slice}",
        )
        self.check(
            f"{label}: low preempted and queued, naming high",
            low_now["status"] == "QUEUED" and "high" in low_now["status_message"],
            f"low is {low_now['status']}: {low_now['status_message']}",
        )
        lost = done_before - restored.step if restored else None
        self.check(
            f"{label}: high resumed from its checkpoint",
            restored is not None and restored.step > 0,
            f"restored step {restored.step if restored else '-'} ({restored.source if restored else '-'}),"
            f" last step done before {done_before}",
        )
        return {"mttr_s": mttr, "steps_lost": lost, "failed_node": failed_node, "t_fail": t_fail,
                "low_attempt": low["attempt"], "restored": restored}

    def _first_step_of_attempt_after(self, name: str, attempt: int) -> Any:
        trace = self.trace(name)
        return next((s for s in trace.steps if s.attempt > attempt), None) if trace else None

    def repair(self, failed_node: str, low_attempt: int, label: str) -> int | None:
        self.wait("low's workers to stop", lambda: any(
            st["attempt"] == low_attempt for st in (self.trace("low").stops if self.trace("low") else [])))  # type: ignore[union-attr]
        stopped_after = max((s.step for s in self.trace("low").steps if s.attempt == low_attempt), default=0)  # type: ignore[union-attr]
        self.node("uncordon", failed_node)
        self.event(f"node {failed_node} repaired: low goes back onto it")
        first = self.wait("low to train again", lambda: self._first_step_of_attempt_after("low", low_attempt))
        trace = self.trace("low")
        restored = next((r for r in trace.restores if r.attempt > low_attempt), None) if trace else None
        lost = stopped_after - restored.step if restored else None
        self.check(
            f"{label}: low resumed where it stopped",
            restored is not None and lost == 0,
            f"low stopped after step {stopped_after}, restored step {restored.step if restored else '-'}"
            f" ({restored.source if restored else '-'}), first step now {first.step}",
        )
        return lost

    def drill(self) -> dict[str, Any]:
        self.create_cluster(3)
        self.submit("low", priority="low", slices=1)
        self.submit("high", priority="high", slices=2, restart_strategy="BlockingRecreate")
        self.wait_steps("high", 40)
        self.wait_steps("low", 20)
        cold = self.failover("cold")
        self.wait_steps("high", cold["restored"].step + 20 if cold["restored"] else 1)
        low_lost = self.repair(cold["failed_node"], cold["low_attempt"], "cold")
        result: dict[str, Any] = {
            "mttr_s": round(cold["mttr_s"], 3),
            "steps_lost": cold["steps_lost"],
            "preempted": ["low"],
            "low_steps_lost": low_lost,
            "logs": str(self.main_log("high")),
        }
        if self.options.warm:
            operations.create_cluster(self.cluster, DEVICE, 3, True, lambda _: True, warm_workers=2)
            self.event("enabling 2 warm spare workers (PyTorch already imported)")
            self.wait("warm spares to be ready", self._spares_ready, timeout=120)
            self.wait_steps("low", self.steps_of("low") + 10)
            warm = self.failover("warm")
            result["mttr_warm_s"] = round(warm["mttr_s"], 3)
            result["steps_lost_warm"] = warm["steps_lost"]
            self.wait_steps("high", self.steps_of("high") + 10)
            self.repair(warm["failed_node"], warm["low_attempt"], "warm")
        self.check("high lost no steps", result["steps_lost"] == 0 and result.get("steps_lost_warm", 0) == 0,
                   f"steps lost: cold {result['steps_lost']}, warm {result.get('steps_lost_warm', '-')}")
        result["goodput"] = {name: self.goodput(name) for name in ("high", "low")}
        result["wait_for_repair_s"] = round(REPAIR_BASELINE_S + cold["mttr_s"], 1)
        return result

    def _spares_ready(self) -> bool:
        paths = registry.existing(self.cluster)
        with Store.open(paths.database) as store:
            spares = store.workers(("warm",))
        return len(spares) >= 2 and all((Path(s.dir) / "ready").exists() for s in spares)


class ElasticDrill(Drill):
    """Seed 001: an elastic job loses a slice, continues on 2 without a restart, grows back to 3."""

    scenario = "elastic"
    title = "an elastic job continues on 2 of 3 slices and grows back"

    def drill(self) -> dict[str, Any]:
        self.create_cluster(3)
        self.submit("elastic", priority="high", slices=3, min_slices=2)
        self.wait_steps("elastic", 40)
        job = self.record("elastic")
        assert job is not None
        attempt = job["attempt"]
        victim = job["slices"][1]
        self.event(f"failing node {victim}-0 (replica 1) under the elastic job")
        t_fail = self.node("fail", f"{victim}-0")
        first = self.wait(
            "training on 2 slices",
            lambda: (lambda tr: next((s for s in tr.steps if s.t > t_fail and s.slices == 2), None) if tr else None)(self.trace("elastic")),
        )
        mttr = first.t - t_fail
        job = self.record("elastic")
        self.event(f"continuing on {len(job['slices'])} slices at step {first.step}, {mttr:.2f}s after the failure")
        self.check("continued on 2 slices without a restart", job["attempt"] == attempt and len(job["slices"]) == 2,
                   f"attempt {job['attempt']} (was {attempt}), slices {', '.join(job['slices'])}")
        before_down = self.trace("elastic").last_step_before(t_fail)  # type: ignore[union-attr]
        self.check("no step lost on the way down", first.step <= before_down + 2,
                   f"last step before the failure {before_down}, first on 2 slices {first.step}")
        self.wait_steps("elastic", first.step + 30)
        t_repair = self.node("uncordon", f"{victim}-0")
        self.event(f"node {victim}-0 repaired: the job grows back to 3 slices")
        back = self.wait(
            "training on 3 slices again",
            lambda: (lambda tr: next((s for s in tr.steps if s.t > t_repair and s.slices == 3), None) if tr else None)(self.trace("elastic")),
        )
        trace = self.trace("elastic")
        joined = trace.restore_after(t_repair) if trace else None
        self.check("the returning replica got its state from a peer", joined is not None and joined.source == "peer",
                   f"restore source {joined.source if joined else '-'} at step {joined.step if joined else '-'}")
        self.wait_steps("elastic", back.step + 20)
        log = self.main_log("elastic")
        awk = run_seed_001_awk(log)
        self.event("seed 001's awk script over the rank-0 log prints:\n" + (awk.strip() or "(nothing)"))
        self.check("awk: 3 -> 2", "Old Slice Count: 3, New Slice Count: 2" in awk, awk.strip().replace("\n", " | "))
        self.check("awk: 2 -> 3 later", _in_order(awk, "Old Slice Count: 3, New Slice Count: 2", "Old Slice Count: 2, New Slice Count: 3"),
                   awk.strip().replace("\n", " | "))
        return {
            "mttr_s": round(mttr, 3),
            "steps_lost": max(0, before_down - first.step + 1),
            "preempted": [],
            "logs": str(log),
            "slice_count_changes": slice_count_changes(log_lines(log)),
            "awk_output": awk,
            "goodput": {"elastic": self.goodput("elastic")},
        }


class MigrationDrill(Drill):
    """Seed 004: delete a job mid-training (SIGTERM -> checkpoint), create it again: 0 steps lost."""

    scenario = "migration"
    title = "delete a job mid-training and create it again: it resumes where it stopped"

    def drill(self) -> dict[str, Any]:
        self.create_cluster(1)
        self.submit("mnist", priority="medium", slices=1)
        self.wait_steps("mnist", 40)
        first_dir = self.workload_dir("mnist")
        self.event("deleting mnist (SIGTERM: it saves a checkpoint and exits)")
        operations.delete_workload(self.cluster, "mnist")
        assert first_dir is not None
        self.wait("the old workers to stop", lambda: not self._live("mnist"))
        stopped_at = read_trace(first_dir).last_step
        self.event(f"mnist stopped after step {stopped_at}; creating it again")
        t_create = time.time()
        self.submit("mnist", priority="medium", slices=1)
        first = self.wait("mnist to train again", lambda: (lambda tr: tr.first_step_after(t_create) if tr else None)(self.trace("mnist")))
        trace = self.trace("mnist")
        restored = trace.restore_after(t_create) if trace else None
        lost = stopped_at - restored.step if restored else None
        self.check("resumed at the step where it stopped", restored is not None and lost == 0,
                   f"stopped after {stopped_at}, restored {restored.step if restored else '-'}, next step {first.step}")
        self.check("restored from the migration checkpoint", restored is not None and restored.source == "migration",
                   f"source {restored.source if restored else '-'}")
        return {
            "mttr_s": round(first.t - t_create, 3),
            "steps_lost": lost,
            "preempted": [],
            "logs": str(self.main_log("mnist")),
            "goodput": {"mnist": self.goodput("mnist")},
        }

    def _live(self, name: str) -> bool:
        paths = registry.existing(self.cluster)
        with Store.open(paths.database) as store:
            return any(w.identity.workload == name for w in store.workers(LIVE_WORKER_STATES))


SEED_001_AWK = Path(__file__).with_name("seed001_slice_changes.awk")


def run_seed_001_awk(log: Path) -> str:
    """Seed 001's verification script, unchanged, over one of our logs."""
    awk = shutil.which("awk")
    if awk is None:
        return ""
    result = subprocess.run([awk, "-f", str(SEED_001_AWK), str(log)], capture_output=True, text=True, check=False)
    return result.stdout


def _in_order(text: str, first: str, second: str) -> bool:
    return first in text and second in text and text.index(first) < text.index(second)


DRILLS = {"hotswap": HotswapDrill, "elastic": ElasticDrill, "migration": MigrationDrill}
