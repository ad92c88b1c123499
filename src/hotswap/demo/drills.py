"""The demo's drills: real PyTorch training on a fresh local cluster, real faults, real recovery.

Each drill creates its own cluster (a unique name), runs the SDK example on it, injects the
faults the seeds describe, measures from the training processes' own records, checks what
must hold, and removes the cluster and its checkpoints (``keep`` leaves everything for
inspection). This module is what every drill shares; the scenarios are in
:mod:`hotswap.demo.scenarios`.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from hotswap.api.spec import workload_spec
from hotswap.api.launch import Launch
from hotswap.backends.local.commands import client
from hotswap.backends.local.backend import LocalBackend
from hotswap.backends.requests import ClusterRequest, new_run
from hotswap.backends.local.workload_files import log_path
from hotswap.backends.local.requests import ChangeNodes, NodeOperation
from hotswap.demo.backing import EMULATED_DEVICE, choose_backing
from hotswap.demo.observe import Trace, log_lines, read_trace, restart_phases
from hotswap.demo.view import DemoView
from hotswap.store import registry
from hotswap.store.paths import home, owner_only, private_dir
from hotswap.backends.local.tables import LocalStore

DEVICE = EMULATED_DEVICE

LOCAL = LocalBackend()  # the drills drive their cluster as the CLI does, through the Backend


# Controller decisions worth showing as they happen (node faults appear as the drill's own lines).
_SHOWN = {"admit", "preempt", "restart", "startworkers", "requeue", "scaledown", "scaleup", "fail", "complete"}



def decision_after(store: LocalStore, name: str, t: float) -> float | None:
    """When the controller first recorded something about workload ``name`` after ``t`` (its
    decision on a failure at ``t``), from the cluster's event timeline."""
    seq = next((r["seq"] for r in store.workload_records() if r["spec"]["name"] == name), None)
    rows = store.timeline(name, seq) if seq is not None else []
    return next((float(row["t"]) for row in rows if float(row["t"]) > t), None)


class DrillFailed(Exception):
    """The drill could not go on (a wait timed out); the summary reports it as failed."""


def warm_spares_ready(drill: Drill, at_least: int = 2) -> bool:
    """Whether the drill's cluster keeps ``at_least`` warm spare workers, each ready (its
    ``ready`` mark: Python and the framework imported)."""
    with drill.store() as store:
        spares = store.worker_rows.select(("warm",))
    return len(spares) >= at_least and all((Path(s.dir) / "ready").exists() for s in spares)


def recorded_recovery(drill: Drill, name: str, asked_at: float) -> tuple[float, float]:
    """(failed_at, recovered_at) of the recovery from the failure asked at ``asked_at``, as the
    records hold it (the controller's failure row to the workers' first productive step after
    it: :mod:`hotswap.core.recovery`), so the drill's MTTR is the one ``workload describe -o json``
    and the dashboard show, not timed from when the drill asked."""
    def ended() -> tuple[float, float] | None:
        progress = LOCAL.describe_workload(drill.cluster, name).get("progress") or {}
        return next(
            ((float(r["failed_at"]), float(r["recovered_at"])) for r in progress.get("recoveries", [])
             if r["failed_at"] >= asked_at - 0.001 and r["recovered_at"] is not None),  # rows are to the ms
            None,
        )
    return drill.wait(f"{name}'s recovery in its records", ended)


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
    backing: str = "auto"  # slices on this machine's GPUs when enough are free (auto), or gpu, or emulated
    state_gb: float = 1.2  # the GPU drill's model and optimizer state on a GPU
    fail_slice: int = 1  # elastic: the index of the slice whose node fails
    # When the command started (epoch s): the origin of the live log's times, the plot's and the
    # wall time (None: when the drill is made).
    started_at: float | None = None


class Drill(abc.ABC):
    scenario = ""
    title = ""
    framework = "torch"
    script = "train.py"  # the example the drill's jobs train

    def __init__(self, options: DemoOptions, live: bool | None = None) -> None:
        self.options = options
        self.cluster = f"demo-{self.scenario}-{secrets.token_hex(2)}"
        self.checks: list[Check] = []
        self.marks: list[dict[str, Any]] = []  # failures, repairs, deletions, creations: for the plot
        self.runs: dict[str, list[Path]] = {}  # each job's runs (directories), oldest first: for the plot
        self.started = options.started_at or time.time()
        self.view = DemoView(f"hotswap demo {self.scenario}: {self.title}", self._state, live, self.started)
        self._seen_event = 0  # the controller's timeline, shown as it grows
        self.workdir = Path.cwd()
        self.device = DEVICE
        self.backed = False  # the drill's slices are GPU-backed

    # ------------------------------------------------------------------ plumbing

    def _state(self) -> dict[str, Any]:
        try:
            cluster = LOCAL.describe_cluster(self.cluster)
        except Exception:  # the cluster is being created or removed
            return {}
        jobs = []
        for job in LOCAL.list_workloads(self.cluster, "EVERYTHING", None):
            trace = self.trace(job["name"])
            jobs.append({**job, "step": trace.last_step if trace else None, "loss": trace.latest_loss() if trace else None})
        return {"slices": cluster["slices"], "jobs": jobs}

    def store(self) -> LocalStore:
        """The drill cluster's database (close it: use ``with``)."""
        return LocalStore.open(registry.existing(self.cluster).database)

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
            store = self.store()
        except Exception:
            return
        with store:
            rows = store.events_after(self._seen_event)
        for row in rows:
            self._seen_event = row["id"]
            if row["kind"] in _SHOWN and row["workload"]:
                self.view.event(f"  controller: {row['workload']} {row['message']}")

    def _fail_fast(self) -> None:
        """A training job that failed will not recover: stop waiting and show why."""
        for job in LOCAL.list_workloads(self.cluster, "FAILED", None):
            directory = self.workload_dir(job["name"])
            tail = log_lines(log_path(directory, 0, 0))[-8:] if directory else []
            raise DrillFailed(f"{job['name']} failed: {job['status_message']}; its log ends:\n" + "\n".join(tail))

    def create_cluster(self, slices: int, warm: int = 0) -> None:
        self.device, gpus = choose_backing(self.options.backing, slices)
        self.backed = gpus is not None
        request = ClusterRequest(self.cluster, self.device, slices, force=True, warm_workers=warm, gpus=gpus)
        summary = LOCAL.create_cluster(request, lambda _: True)
        where = "GPUs " + ", ".join(str(g["index"]) for s in summary["slices"] for g in s["gpus"]) if self.backed else "emulated"
        self.event(f"cluster {self.cluster}: {slices} x {self.device} (1 host per slice, {where}), controller started")

    def submit(
        self, name: str, *, priority: str, slices: int, steps: int = 1_000_000, script: str | Path | None = None,
        args: str = "", **flags: Any,
    ) -> None:
        path = script if isinstance(script, Path) else example_script(script or self.script)  # a Path: a script of the caller's
        command = (
            f"{sys.executable} {path} --steps {steps} --step-sleep {self.options.step_sleep}"
            f" --checkpoint-every 50 {args}"
        ).rstrip()
        spec = workload_spec(
            name=name, command=command, device_type=self.device, num_slices=slices, priority=priority,
            **{"termination_grace_period_s": 20.0, "max_restarts": 3, "env": {"OMP_NUM_THREADS": "1"}, **flags},
        )
        run = new_run(None, fresh=False)  # as `workload create` does: a new run, resuming a pending migration
        launch = Launch(
            environ=dict(os.environ), cwd=str(self.workdir),
            checkpoint_dir=str(registry.existing(self.cluster).checkpoint_dir(name) / run.id), run=run,
        )
        t = time.time()
        view = LOCAL.create_workload(self.cluster, spec, launch)
        directory = self.workload_dir(name)
        if directory is not None and directory not in self.runs.setdefault(name, []):
            if self.runs[name]:  # created again: a point on the plot
                self.marks.append({"t": t, "what": "create", "workload": name})
            self.runs[name].append(directory)
        self.event(f"{name} ({priority}, {slices} slice(s)) submitted: {view['status']} on {', '.join(view['slices']) or '-'}")

    def record(self, name: str) -> dict[str, Any] | None:
        return next((w for w in LOCAL.list_workloads(self.cluster, "EVERYTHING", None) if w["name"] == name), None)

    def workload_dir(self, name: str) -> Path | None:
        paths = registry.existing(self.cluster)
        with self.store() as store:
            seq = next((r["seq"] for r in store.workload_records() if r["spec"]["name"] == name), None)
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
        outcome = client.request(paths, ChangeNodes(NodeOperation(operation), (node,)))
        if outcome.status != "done":
            raise DrillFailed(outcome.message)
        self.marks.append({"t": t, "what": operation, "node": node})
        self._follow_controller()
        return t

    def main_log(self, name: str, replica: int = 0) -> Path:
        directory = self.workload_dir(name)
        assert directory is not None
        return log_path(directory, replica, 0)

    def goodput(self, name: str) -> dict[str, Any]:
        return LOCAL.describe_workload(self.cluster, name)["goodput"]

    def timeline(self) -> list[dict[str, Any]]:
        with self.store() as store:
            return [dict(r) for r in store.timeline()]

    def cleanup(self) -> None:
        if registry.find(self.cluster) is None:
            return  # never created (the drill stopped before it could)
        if self.options.keep:
            self.event(f"kept cluster {self.cluster} (delete it with `hotswap cluster delete --cluster {self.cluster}`)")
            return
        try:
            checkpoints = registry.existing(self.cluster).checkpoint_dir("x").parent
            LOCAL.delete_cluster(self.cluster, lambda _: True)
            shutil.rmtree(checkpoints, ignore_errors=True)
            self.event(f"cluster {self.cluster} deleted")
        except Exception as error:  # report, never mask the drill's own outcome
            self.event(f"cleanup of {self.cluster} failed: {error}")

    # ------------------------------------------------------------------ running

    def run(self) -> dict[str, Any]:
        summary: dict[str, Any] = {"scenario": self.scenario, "framework": self.framework, "cluster": self.cluster}
        summary["started_t"] = self.started  # the origin of the log's times and the plot's
        with self.view:
            try:
                summary.update(self.drill())
            except DrillFailed as error:
                self.check("drill completed", False, str(error))
            finally:
                summary["hangs"] = check_no_hang(self)
                summary["unexpected_restarts"] = check_no_charged_restart(self) + check_only_injected_disruptions(self)
                summary["timeline"] = self._safe_timeline()
                summary["marks"] = self.marks
                summary["progress"] = self._safe_progress()
                if not self.options.keep:
                    self._archive(summary)
                self.cleanup()
        summary["backing"] = "gpu" if self.backed else "emulated"
        summary["checks"] = [dataclasses.asdict(c) for c in self.checks]
        summary["passed"] = bool(self.checks) and all(c.passed for c in self.checks)
        summary["wall_s"] = round(time.time() - self.started, 1)
        return {"mttr_s": None, "steps_lost": None, "preempted": [], "logs": None, **summary}

    def _archive(self, summary: dict[str, Any]) -> None:
        """Keep the training logs and goodput events of a drill whose cluster is removed
        (``<state>/demo-runs/<cluster>/``); the summary's paths point there."""
        try:
            source = registry.existing(self.cluster).root / "workloads"
        except Exception:
            return
        target = private_dir(private_dir(home() / "demo-runs") / self.cluster)
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("workers", "membership.*"), dirs_exist_ok=True)
        owner_only(target)  # a copy is as private as what hotswap writes, whatever the source's modes
        for key in ("logs",):
            if summary.get(key):
                summary[key] = str(summary[key]).replace(str(source), str(target))
        summary["archive"] = str(target)

    def _safe_progress(self) -> dict[str, list[tuple[float, int, int | None]]]:
        """Each job's (time, step, slices) as its rank 0 reported them, over every run of it
        (a job deleted and created again has two): every step, none thinned out."""
        progress: dict[str, list[tuple[float, int, int | None]]] = {}
        try:
            names = {w["name"] for w in LOCAL.list_workloads(self.cluster, "EVERYTHING", None)} | set(self.runs)
        except Exception:
            names = set(self.runs)
        for name in sorted(names):
            directories = list(self.runs.get(name, []))
            current = self._safe_dir(name)
            if current is not None and current not in directories:
                directories.append(current)
            points: list[tuple[float, int, int | None]] = []
            for directory in directories:
                steps = read_trace(directory).steps
                points += [(s.t, s.step, s.slices) for s in steps if s.replica == 0 and s.host == 0] or [
                    (s.t, s.step, s.slices) for s in steps
                ]
            if points:
                progress[name] = sorted(points)
        return progress

    def _safe_dir(self, name: str) -> Path | None:
        try:
            return self.workload_dir(name)
        except Exception:
            return None

    def _safe_timeline(self) -> list[dict[str, Any]]:
        try:
            return self.timeline()
        except Exception:
            return []

    @abc.abstractmethod
    def drill(self) -> dict[str, Any]:
        """Run the scenario; return its part of the summary (checks go through ``check``)."""


def check_no_hang(drill: Drill) -> list[str]:
    """No drill makes a job hang: a workload declared hung (and so restarted or failed) is a
    false hang or a real fault, and the drill fails either way, naming it."""
    try:
        with drill.store() as store:
            hung = [f"{row['workload']}: {row['message']}" for row in store.events_after(0) if row["kind"] == "hung"]
    except Exception as error:  # report, never mask the drill's own outcome
        drill.event(f"could not read the hang events: {error}")
        return []
    drill.check("no workload was declared hung", not hung, "; ".join(hung) or "none")
    return hung


def check_no_charged_restart(drill: Drill) -> list[str]:
    """A drill injects only what the failure policy never charges (lost nodes, drains,
    preemptions, deletions): a restart it charged (a worker's failure exit, a hang) was not
    injected, and the drill fails, naming the workload and why it last restarted."""
    try:
        records = LOCAL.list_workloads(drill.cluster, "EVERYTHING", None)
    except Exception as error:  # report, never mask the drill's own outcome
        drill.event(f"could not read the workloads' restarts: {error}")
        return []
    charged = [f"{w['name']}: {w['restarts']} restart(s), last: {w['status_message']}" for w in records if w.get("restarts")]
    drill.check("no workload was restarted by its failure policy", not charged, "; ".join(charged) or "none")
    return charged


FAULTS = ("fail", "drain", "cordon")  # the drill's own node faults (its marks): each may restart a workload once
RESTART_KINDS = ("restart", "requeue")  # the controller restarted a workload (or queued it to, without capacity)


def check_only_injected_disruptions(drill: Drill) -> list[str]:
    """Nothing restarts or fails but what the drill injected, from the controller's records:
    no workload failed, and none restarted more often than the drill failed, drained or
    cordoned a node (a drill that injects none sees no restart; a deletion or preemption is
    no restart). Restarts the failure policy charged are :func:`check_no_charged_restart`'s."""
    try:
        rows = drill.timeline()
    except Exception as error:  # report, never mask the drill's own outcome
        drill.event(f"could not read the controller's records: {error}")
        return []
    injected = sum(mark["what"] in FAULTS for mark in drill.marks)
    restarts: dict[str, int] = {}
    for row in rows:
        if row["kind"] in RESTART_KINDS and row["workload"]:
            restarts[row["workload"]] = restarts.get(row["workload"], 0) + 1
    extra = [f"{name}: restarted {count} time(s), {injected} fault(s) injected" for name, count in sorted(restarts.items()) if count > injected]
    failed = [f"{row['workload']}: {row['message']}" for row in rows if row["kind"] == "fail"]
    drill.check("nothing restarted or failed but what the drill injected", not extra and not failed,
                "; ".join(extra + failed) or f"{sum(restarts.values())} restart(s) for {injected} injected fault(s), no failure")
    return extra + failed


def phases_of_restart(drill: Drill, name: str, t_fail: float, attempt: int) -> dict[str, float | None]:
    """The phases of the restart of ``name`` in ``drill`` after a failure at ``t_fail`` (see
    :func:`hotswap.demo.observe.restart_phases`), attempts after ``attempt`` being the new ones."""
    trace = drill.trace(name)
    with drill.store() as store:
        decided = decision_after(store, name, t_fail)
    return restart_phases(trace, t_fail, attempt, decided) if trace else {}
