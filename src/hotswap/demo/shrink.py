"""``hotswap demo shrink``: a high-priority job that needs a slice shrinks an elastic
low-priority job instead of evicting it, and the low job grows back when the slice is free.

The scheduler's rule (:func:`hotswap.core.preemption.plan_reclaim`: shrink before evict) on
real processes: ``low`` trains elastic on every slice of the cluster (``--min-slices`` one
less); ``high`` arrives needing one slice, takes low's last replica's slice, trains a fixed
number of steps and completes; low trains on through all of it and takes the slice back.

Everything is measured from the workers' own records (their goodput events and logs, as
:mod:`hotswap.demo.observe` reads them) and their own environments (``/proc``), sampled
throughout the drill, never from the controller's view alone:

- low never leaves RUNNING, keeps its attempt (no restart, no eviction, no preemption);
- low's rank 0 completes every step exactly once: no step repeated (work lost), none skipped;
- low's rank 0 log shows N -> N-1 -> N slices (seed 001's awk script reads the same lines);
- at every sample, no two live workers of one job share a replica index, rank or slice id;
- high's MTTR is the time from its submission to its first training step, as its worker
  logged it (as ``hotswap demo migration`` measures from the creation of the job).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hotswap.backends.local.tables import LIVE_WORKER_STATES
from hotswap.demo.drills import DemoOptions, Drill
from hotswap.demo.observe import (
    StepRecord, Trace, log_lines, process_environment, shared_identities, slice_count_changes,
    survivor_stall,
)

SAMPLE_EVERY_S = 0.2  # how often the drill looks at the jobs' states and the workers' environments


def step_faults(steps: list[int]) -> dict[str, list[int]]:
    """What breaks continuity in one rank's step numbers, in the order it completed them:
    ``repeated`` steps (done twice: work thrown away and redone) and ``skipped`` ones (never
    reported). Both empty when the steps are ``first, first + 1, ..., last`` exactly."""
    repeated: list[int] = []
    skipped: list[int] = []
    highest: int | None = None
    for step in steps:
        if highest is not None and step <= highest:
            repeated.append(step)
            continue
        if highest is not None and step > highest + 1:
            skipped.extend(range(highest + 1, step))
        highest = step
    return {"repeated": repeated, "skipped": skipped}


def rank0_steps(trace: Trace) -> list[StepRecord]:
    """Replica 0's host 0, every attempt, in the order it completed them."""
    return [s for s in trace.steps if s.replica == 0 and s.host == 0]


class ShrinkDrill(Drill):
    """Shrink instead of evict: high takes one of low's slices; low trains on, then grows back."""

    scenario = "shrink"
    title = "a high-priority job shrinks an elastic low-priority job instead of evicting it"
    slices = 3  # N: low trains on N, then N-1 while high runs, then N again
    high_steps = 100  # high trains this many steps, then completes and frees its slice

    def __init__(self, options: DemoOptions, live: bool | None = None, worker: Path | None = None) -> None:
        super().__init__(options, live)
        self.worker = worker  # the script both jobs run; None: the SDK example (PyTorch)
        self._sampled = 0.0
        self.samples = 0
        self.low_seen: list[tuple[str, int, int]] = []  # (status, attempt, slices) of low, each change
        self.clashes: list[str] = []  # live workers of one job sharing an index, as sampled

    # ------------------------------------------------------------------ observation

    def wait(self, what: str, predicate: Any, timeout: float | None = None) -> Any:
        def sampled() -> Any:
            self.sample()
            return predicate()

        return super().wait(what, sampled, timeout)

    def sample(self, force: bool = False) -> None:
        """Low's state, and the live workers' own identities, at most every SAMPLE_EVERY_S."""
        now = time.monotonic()
        if not force and now - self._sampled < SAMPLE_EVERY_S:
            return
        self._sampled = now
        try:
            low = self.record("low")
            with self.store() as store:
                rows = [w for w in store.worker_rows.select(LIVE_WORKER_STATES) if w.pid is not None]
        except Exception:  # the cluster is being created or removed
            return
        self.samples += 1
        if low is not None:
            seen = (low["status"], low["attempt"], len(low["slices"]))
            if not self.low_seen or self.low_seen[-1] != seen:
                self.low_seen.append(seen)
        jobs: dict[str, list[dict[str, str]]] = {}
        for row in rows:
            env = process_environment(row.pid)  # empty once the process is gone
            if env:
                jobs.setdefault(row.identity.workload, []).append(env)
        for job, environments in sorted(jobs.items()):
            for shared in shared_identities(environments):
                self.clashes.append(f"{job}: {shared} at {time.time() - self.started:.1f}s")

    def first_step(self, name: str, after: float, slices: int | None = None) -> StepRecord | None:
        trace = self.trace(name)
        if trace is None:
            return None
        return next((s for s in trace.steps if s.t > after and (slices is None or s.slices == slices)), None)

    def submit_job(self, name: str, mark: bool = True, **flags: Any) -> float:
        t = time.time()
        self.submit(name, script=self.worker, **flags)
        if mark:
            self.marks.append({"t": t, "what": "submit", "workload": name})
        return t

    def completed_at(self, name: str) -> float | None:
        """When the controller recorded the job's completion (its timeline), None before."""
        record = self.record(name)
        if record is None or record["status"] != "SUCCESSFUL":
            return None  # (the timeline is read once the job is done, not at every poll)
        return next((float(r["t"]) for r in self.timeline() if r["kind"] == "complete" and r["workload"] == name), None)

    # ------------------------------------------------------------------ the drill

    def drill(self) -> dict[str, Any]:
        n = self.slices
        self.create_cluster(n)
        self.submit_job("low", mark=False, priority="low", slices=n, min_slices=n - 1)
        self.wait_steps("low", 40)
        before = self.record("low")
        assert before is not None
        attempt, given = before["attempt"], before["slices"][-1]
        self.event(f"low trains on {n} slices; submitting high (1 slice): the cluster has no free slice")
        t_submit = self.submit_job("high", priority="high", slices=1, steps=self.high_steps)
        first_high = self.wait("high to train", lambda: self.first_step("high", t_submit))
        mttr = first_high.t - t_submit
        down = self.wait(f"low to train on {n - 1} slices", lambda: self.first_step("low", t_submit, n - 1))
        low, high = self.record("low"), self.record("high")
        assert low is not None and high is not None
        self.event(f"high trains {mttr:.2f}s after its submission; low trains on at step {down.step} on {n - 1} slices")
        self.check(
            "high took the slice low gave up (low's last replica), low kept running",
            high["slices"] == [given] and low["status"] == "RUNNING" and given not in low["slices"],
            f"high on {', '.join(high['slices']) or '-'} (low's last was {given}); low {low['status']} on"
            f" {', '.join(low['slices'])}",
        )
        t_done = self.wait("high to complete", lambda: self.completed_at("high"))
        self.marks.append({"t": t_done, "what": "complete", "workload": "high"})
        self.event(f"high completed its {self.high_steps} steps: its slice is free")
        up = self.wait(f"low to train on {n} slices again", lambda: self.first_step("low", t_done, n))
        self.wait_steps("low", up.step + 20)
        self.sample(force=True)
        return self._verdict(n, attempt, (t_submit, t_done), down, up, mttr, first_high)

    def _verdict(
        self, n: int, attempt: int, times: tuple[float, float], down: StepRecord, up: StepRecord, mttr: float,
        first_high: StepRecord,
    ) -> dict[str, Any]:
        t_submit, t_done = times
        low = self.record("low")
        assert low is not None
        statuses = sorted({status for status, _, _ in self.low_seen})
        attempts = sorted({a for _, a, _ in self.low_seen})
        self.check(
            "low was never evicted, restarted or failed",
            statuses == ["RUNNING"] and attempts == [attempt] and low["preemptions"] == 0 and low["restarts"] == 0,
            f"low's states seen: {', '.join(statuses)}; attempts {attempts}; preemptions {low['preemptions']},"
            f" restarts {low['restarts']} ({self.samples} samples)",
        )
        sizes = [s for _, _, s in self.low_seen]
        held = [k for i, k in enumerate(sizes) if i == 0 or sizes[i - 1] != k]
        self.check(f"low held {n} -> {n - 1} -> {n} slices", held == [n, n - 1, n], f"slices held, in order: {held}")
        trace = self.trace("low")
        assert trace is not None
        steps = [s.step for s in rank0_steps(trace)]
        faults = step_faults(steps)
        lost = len(faults["repeated"])
        self.check(
            "low's rank 0 did every step once: none repeated (lost), none skipped",
            bool(steps) and not faults["repeated"] and not faults["skipped"],
            f"steps {steps[0] if steps else '-'}..{steps[-1] if steps else '-'}; repeated {faults['repeated'][:5]},"
            f" skipped {faults['skipped'][:5]}",
        )
        restarts = [r for r in trace.restores if r.attempt == attempt and r.t > t_submit and r.source != "peer"]
        self.check("low's workers never restored from a checkpoint", not restarts,
                   ", ".join(f"step {r.step} ({r.source})" for r in restarts) or "no restore from disk after the start")
        log = self.main_log("low")
        changes = slice_count_changes(log_lines(log))
        self.check(
            f"low's rank 0 log: {n} -> {n - 1} -> {n} slices",
            [(old, new) for _, old, new in changes] == [(n, n - 1), (n - 1, n)],
            "; ".join(f"step {step}: {old} -> {new}" for step, old, new in changes) or "no change logged",
        )
        self.check(
            "every live worker of a job had its own replica index, rank and slice id, at every sample",
            self.samples > 0 and not self.clashes,
            f"{self.samples} samples; " + ("; ".join(self.clashes[:5]) or "all distinct"),
        )
        stall_down = survivor_stall(trace, 0, n, n - 1, t_submit)
        stall_up = survivor_stall(trace, 0, n - 1, n, t_done)
        return {
            "mttr_s": round(mttr, 3),
            "stall_down_s": stall_down["stall_s"] if stall_down else None,
            "stall_up_s": stall_up["stall_s"] if stall_up else None,
            "usual_step_s": stall_up["usual_step_s"] if stall_up else None,
            "high_first_step": first_high.step,
            "steps_lost": lost,
            "low_steps_skipped": len(faults["skipped"]),
            "low_slices": held,
            "low_down_at_step": down.step,
            "low_up_at_step": up.step,
            "preempted": [],
            "shrunk": ["low"],
            "logs": str(log),
            "slice_count_changes": changes,
            "samples": self.samples,
            "goodput": {name: self.goodput(name) for name in ("high", "low")},
        }

