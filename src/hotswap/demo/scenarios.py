"""The demo's scenarios, one drill each: seed 000 (hotswap), seed 001 (elastic slices) and
seed 004 (migration on deletion). The plumbing they share is in :mod:`hotswap.demo.drills`."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from hotswap.backends.local.commands.new_cluster import new_cluster_warm_workers
from hotswap.backends.requests import ClusterRequest
from hotswap.demo.drills import LOCAL, Drill, DrillFailed, phases_of_restart, recorded_recovery, warm_spares_ready
from hotswap.demo.gpu_drill import GpuDrill
from hotswap.demo.shrink import ShrinkDrill
from hotswap.demo.observe import (
    log_lines,
    process_environment,
    read_trace,
    repeated_steps,
    resumed_from_last_checkpoint,
    shared_identities,
    slice_count_changes,
    survivor_stall,
)
from hotswap.backends.local.tables import LIVE_WORKER_STATES

REPAIR_BASELINE_S = 600.0  # GKE's node repair, what a job waits without hotswap


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
        asked = self.node("fail", failed_node)
        # Recovery ends at the first step of the new attempt, as its workers logged it.
        after = self.wait("high to train again", lambda: self._first_step_of_attempt_after("high", high["attempt"]))
        t_fail, recovered = recorded_recovery(self, "high", asked)
        mttr = recovered - t_fail
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
        self.check(f"{label}: high resumed from its last checkpoint", *resumed_from_last_checkpoint(trace, high["attempt"]))
        phases = phases_of_restart(self, "high", t_fail, high["attempt"])
        self.event("restart phases (s after the failure): " + ", ".join(f"{k.removesuffix('_s')} {v}" for k, v in phases.items()))
        return {"mttr_s": mttr, "steps_lost": lost, "failed_node": failed_node, "t_fail": t_fail,
                "low_attempt": low["attempt"], "restored": restored, "phases": phases}

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
            # No spare is kept for this restart: it is forked from the cluster's zygote where it has one.
            "zygote": bool(LOCAL.describe_cluster(self.cluster).get("zygote")),
            "restart_phases": cold["phases"],
            "steps_lost": cold["steps_lost"],
            "preempted": ["low"],
            "low_steps_lost": low_lost,
            "logs": str(self.main_log("high")),
        }
        # What a cluster created without --warm-workers keeps (auto: slices and free memory).
        result["default_warm_workers"] = default = new_cluster_warm_workers(3, 1)
        if self.options.warm:
            spares = default if default >= 2 else 2
            LOCAL.create_cluster(ClusterRequest(self.cluster, self.device, 3, force=True, warm_workers=spares), lambda _: True)
            self.event(f"warm spare workers (PyTorch already imported): {f'the default, {spares}' if default >= 2 else 2}"
                       f" ({default} by default here)")
            self.wait("warm spares to be ready", lambda: warm_spares_ready(self), timeout=120)
            self.wait_steps("low", self.steps_of("low") + 10)
            warm = self.failover("warm")
            result["mttr_warm_s"] = round(warm["mttr_s"], 3)
            result["restart_phases_warm"] = warm["phases"]
            result["mttr_default_s"] = result["mttr_warm_s"] if default >= 2 else result["mttr_s"]
            result["steps_lost_warm"] = warm["steps_lost"]
            self.wait_steps("high", self.steps_of("high") + 10)
            self.repair(warm["failed_node"], warm["low_attempt"], "warm")
        self.check("high lost no steps", result["steps_lost"] == 0 and result.get("steps_lost_warm", 0) == 0,
                   f"steps lost: cold {result['steps_lost']}, warm {result.get('steps_lost_warm', '-')}")
        result["goodput"] = {name: self.goodput(name) for name in ("high", "low")}
        result["wait_for_repair_s"] = round(REPAIR_BASELINE_S + cold["mttr_s"], 1)
        return result


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
        failing = self.options.fail_slice
        survivor = 1 if failing == 0 else 0  # a replica whose slice stays: its log and step times
        victim = job["slices"][failing]
        self.event(f"failing node {victim}-0 (replica {failing}) under the elastic job")
        asked = self.node("fail", f"{victim}-0")
        first = self.wait(
            "training on 2 slices",
            lambda: (lambda tr: next((s for s in tr.steps if s.t > asked and s.slices == 2), None) if tr else None)(self.trace("elastic")),
        )
        t_fail, recovered = recorded_recovery(self, "elastic", asked)
        mttr = recovered - t_fail
        job = self.record("elastic")
        self.event(f"continuing on {len(job['slices'])} slices at step {first.step}, {mttr:.2f}s after the failure")
        self.check("continued on 2 slices without a restart", job["attempt"] == attempt and len(job["slices"]) == 2,
                   f"attempt {job['attempt']} (was {attempt}), slices {', '.join(job['slices'])}")
        # The last step on 3 slices: the failed node's worker is killed once the fault is
        # committed, so the 3-slice group may finish a step or two after the failure was asked.
        steps = self.trace("elastic").steps  # type: ignore[union-attr]
        before_down = max((s.step for s in steps if s.t < first.t and s.slices == 3), default=0)
        self.check("no step lost on the way down", first.step <= before_down + 2,
                   f"last step before the failure {before_down}, first on 2 slices {first.step}")
        self._check_loss_seen(t_fail)  # a JAX survivor's next program records what its previous one saw
        self.wait_steps("elastic", first.step + 30)
        t_repair = self.node("uncordon", f"{victim}-0")
        self.event(f"node {victim}-0 repaired: the job grows back to 3 slices")
        back = self.wait(
            "training on 3 slices again",
            lambda: (lambda tr: next((s for s in tr.steps if s.t > t_repair and s.slices == 3), None) if tr else None)(self.trace("elastic")),
        )
        trace = self.trace("elastic")
        # The returning replica's own restore: the survivors restart into the grown group too
        # and take their own state back (a restore of theirs would say so, not this one's).
        joined = trace.restore_after(t_repair, replica=failing) if trace else None
        self.check("the returning replica got its state from a peer", joined is not None and joined.source == "peer",
                   f"replica {failing}: restore source {joined.source if joined else '-'} at step {joined.step if joined else '-'}")
        self.wait_steps("elastic", back.step + 20)
        self._check_one_replica_each("elastic")
        # What the survivors lived through, from their own step times.
        trace = self.trace("elastic")
        stall_down = survivor_stall(trace, survivor, 3, 2, t_fail) if trace else None
        stall_up = survivor_stall(trace, survivor, 2, 3, t_repair) if trace else None
        if stall_up:
            self.event(
                f"grow-back: the survivors stalled {stall_up['stall_s']:.2f}s between step {stall_up['last_step']}"
                f" (2 slices) and step {stall_up['first_step']} (3 slices); a step usually takes {stall_up['usual_step_s']:.2f}s"
            )
        log = self.main_log("elastic", survivor)
        awk = run_seed_001_awk(log)
        self.event(f"seed 001's awk script over replica {survivor}'s log prints:\n" + (awk.strip() or "(nothing)"))
        self.check("awk: 3 -> 2", "Old Slice Count: 3, New Slice Count: 2" in awk, awk.strip().replace("\n", " | "))
        self.check("awk: 2 -> 3 later", _in_order(awk, "Old Slice Count: 3, New Slice Count: 2", "Old Slice Count: 2, New Slice Count: 3"),
                   awk.strip().replace("\n", " | "))
        return {
            "mttr_s": round(mttr, 3),
            "steps_lost": max(0, before_down - first.step + 1),
            "preempted": [],
            "logs": str(log),
            "slice_count_changes": slice_count_changes(log_lines(log)),
            "failed_slice": failing,
            "stall_down_s": stall_down["stall_s"] if stall_down else None,
            "stall_up_s": stall_up["stall_s"] if stall_up else None,
            "usual_step_s": stall_up["usual_step_s"] if stall_up else None,
            "awk_output": awk,
            "goodput": {"elastic": self.goodput("elastic")},
        }

    def _check_loss_seen(self, t_fail: float) -> None:
        """The survivors noticed the lost slice as it went (its connections closed), not when a
        collective timed out: their own records of the change to 2 slices say which."""

        def records() -> list[dict[str, Any]] | None:
            trace = self.trace("elastic")
            down = [e for e in trace.elastic if e["t"] > t_fail and e.get("slices") == 2] if trace else []
            return down if len({(e["replica"], e["host"]) for e in down}) >= 2 else None

        try:  # written as they train on: at once, unless the job restarted instead
            down = self.wait("the survivors' records of the change to 2 slices", records, timeout=10.0)
        except DrillFailed:
            down = []
        late = [f"replica {e['replica']}" for e in down if e.get("timed_out")]
        self.check("the survivors saw the slice go, without waiting for a timeout", bool(down) and not late,
                   f"{len(down)} survivors re-formed ({', '.join(sorted({str(e.get('cause')) for e in down}))}); "
                   + (f"at a collective timeout: {', '.join(late)}" if late else "none at a collective timeout"))

    def _check_one_replica_each(self, name: str) -> None:
        """From the workers' own environments and logs: no two live workers share a replica
        index, rank or slice id, and no replica's log has two writers (a step twice)."""
        with self.store() as store:
            pids = [w.pid for w in store.worker_rows.select(LIVE_WORKER_STATES, name) if w.pid is not None and w.state != "stopping"]
        environments = [env for env in (process_environment(pid) for pid in pids) if env]
        shared = shared_identities(environments)
        self.check("every live worker has its own replica index and rank", len(environments) == 3 and not shared,
                   f"{len(environments)} live workers; " + (", ".join(shared) or "all distinct"))
        directory = self.workload_dir(name)
        logs = sorted((directory / "logs").glob("slice-*-host-*.log")) if directory else []
        repeated = {log.name: repeated_steps(log_lines(log)) for log in logs}
        twice = {log: steps for log, steps in repeated.items() if steps}
        self.check("each replica's log has one writer", not twice,
                   "; ".join(f"{log} repeats steps {steps[:5]}" for log, steps in twice.items()) or f"{len(logs)} logs, no step twice")


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
        self.marks.append({"t": time.time(), "what": "delete", "workload": "mnist"})
        LOCAL.delete_workload(self.cluster, "mnist")
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
        self.wait_steps("mnist", first.step + 20)  # and it trains on
        return {
            "mttr_s": round(first.t - t_create, 3),
            "steps_lost": lost,
            "preempted": [],
            "logs": str(self.main_log("mnist")),
            "goodput": {"mnist": self.goodput("mnist")},
        }

    def _live(self, name: str) -> bool:
        with self.store() as store:
            return any(w.identity.workload == name for w in store.worker_rows.select(LIVE_WORKER_STATES))


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


DRILLS = {"hotswap": HotswapDrill, "elastic": ElasticDrill, "migration": MigrationDrill, "gpu": GpuDrill, "shrink": ShrinkDrill}
