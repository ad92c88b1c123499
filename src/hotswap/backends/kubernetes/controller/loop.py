"""The controller of a Kubernetes cluster: ``hotswap controller run`` (foreground, or in-cluster
from the Deployment of ``hotswap controller manifests``).

Level-triggered: watches on Nodes, JobSets and pods only say *something changed*; each wake-up
(or a periodic resync, or the earliest deadline the last round's checks met and that has not
come yet: :mod:`~hotswap.backends.kubernetes.deadlines`)
lists the live objects, rebuilds the core's snapshot from them
(:func:`hotswap.backends.kubernetes.observation.observe`), runs one decision round of the same
core the simulator and the local backend use, and enacts the resulting operations. Nothing is
kept in memory that the cluster does not also hold, so a restarted controller picks up where
the last one stopped. A round with nothing to change writes nothing.

Only the holder of the ``hotswap-controller`` Lease acts (:mod:`~hotswap.backends.kubernetes.
lease`): it renews the Lease on its own thread, and stops writing, even mid-reconcile, once it
has failed to renew for the renew deadline. Errors of the API server (unreachable, forbidden,
a missing CRD, conflicts) are logged as one line and retried with backoff; the process does not
exit for them. Metrics: :mod:`hotswap.backends.kit.metrics`. Started by ``entry.py``; the Lease is
kept by ``leader.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hotswap.api.errors import ConflictError, HotswapError
from hotswap.backends.kit.figures import RecoveryFigures
from hotswap.backends.kit.metrics import ControllerMetrics
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes import operations as ops
from hotswap.backends.kubernetes.client import ForbiddenError, KubeClient, KubernetesError, UnreachableError
from hotswap.backends.kubernetes.controller.enactment import Enactment
from hotswap.backends.kubernetes.controller.leader import LeaderElector, log_line
from hotswap.backends.kubernetes.controller.report_intervals import ReportIntervals
from hotswap.backends.kubernetes.controller.training import TrainingRecords
from hotswap.backends.kubernetes.failed_runs import FailedRunRecorder
from hotswap.backends.kubernetes.lease import RETRY_PERIOD_S
from hotswap.backends.kubernetes.observation import Observation
from hotswap.backends.kubernetes.observation import observe as observe_cluster
from hotswap.backends.kubernetes.planning import plan
from hotswap.backends.kubernetes.settings import KubeSettings
from hotswap.core.effects import ActionEffect, effects_of
from hotswap.core.policy import SchedulerConfig
from hotswap.core.scheduler import Decision, decide
from hotswap.core.workload import Workload

RESYNC_EVERY_S = 30.0
DEBOUNCE_S = 0.1  # let a burst of watch events (a drained pool) become one reconcile
MAX_BACKOFF_S = 60.0


class KubeController:
    def __init__(
        self,
        client: KubeClient,
        cluster: str,
        clock: Callable[[], float] = time.time,
        metrics: ControllerMetrics | None = None,
        may_act: Callable[[], bool] | None = None,
        log: Callable[[str], None] = log_line,
    ) -> None:
        self.client = client
        self.cluster = cluster
        self.settings: KubeSettings = client.settings
        self.clock = clock
        self.config = SchedulerConfig()
        self.metrics = metrics
        self.may_act = may_act or (lambda: True)
        self.log = log
        self.wake_at: float | None = None  # the last round asked to be run again by then
        self.figures = RecoveryFigures(metrics) if metrics is not None else None
        self.training = TrainingRecords(  # the workers' own records
            client.list_report_leases, log, clock, client.get_worker_access, client.namespace,
        )
        self.failed_runs = FailedRunRecorder(client, cluster)  # the cluster's record of the runs that failed
        self.intervals = ReportIntervals(client.patch_lease, log)  # the records' heartbeat interval follows the cluster

    def observe(self) -> Observation:
        client = self.client
        return observe_cluster(
            nodes=client.list_nodes(),
            jobsets=client.list_jobsets(self.cluster),
            jobs=client.list_jobs(),
            pods=client.list_pods(labels.WORKLOAD_LABEL),
            settings=self.settings,
            cluster=self.cluster,
            now=self.clock(),
            # With Kueue too: its quota is no capacity, and pods of other owners (not queued in
            # Kueue, or in another ClusterQueue) hold nodes kube-scheduler would preempt them from.
            others=client.list_unfinished_pods(),
            kueue_objects=client.list_kueue_workloads() if self.settings.kueue else [],
        )

    def reconcile(self) -> list[ops.Operation]:
        """One round: observe, decide, enact. Returns what it did."""
        started = time.perf_counter()
        writes = self.client.writes
        try:
            return self._round(started, writes)
        except HotswapError:
            self.training.interrupted()  # the API server failed us: maybe the workers too
            raise

    def _round(self, started: float, writes: int) -> list[ops.Operation]:
        observation = self.observe()
        observation.events.extend(self.training.read(observation))  # hangs, judged from the workers' records
        decision = decide(observation.snapshot, observation.events, observation.now, self.config)
        effects = effects_of(decision.actions)  # once per action: the plan and the figures read it
        operations = plan(observation, decision, effects)
        for line in ops.decisions_summary(operations):
            self.log(line)
        refused = self.enact(operations, observation)
        if self.may_act():  # (writes of the leader only)
            self._record_failed_runs(observation)
            self.intervals.keep(self.training.leases, len(observation.discovery.slices), observation.now)
        wakes = (observation.wake_at, self.training.wake_at, self.intervals.wake_at)
        self.wake_at = min((t for t in wakes if t is not None), default=None)
        self._account(observation, decision, effects, refused, time.perf_counter() - started, self.client.writes - writes)
        return operations

    def enact(self, operations: list[ops.Operation], observation: Observation) -> set[str]:
        """Apply operations in order while this controller may act; one failing does not stop
        the others (the next reconcile retries whatever is still out of line), except an
        unreachable API server, and a JobSet's refused record: its decision was not committed,
        so nothing else of that JobSet is done this round (the next one decides again on fresh
        objects). Returns the JobSets whose record was refused."""
        enactment = Enactment(self.client, {name: job.uid for name, job in observation.jobsets.items()}, observation.now)
        for op in operations:
            if not self.may_act():
                self.log("warning: no longer the leader: the rest of this round is left to the next leader")
                break
            if op.jobset in enactment.refused:
                continue  # its decision was not committed: nothing of it is written (pod releases included)
            try:
                ops.dispatch(op, enactment)
            except UnreachableError:
                raise
            except ConflictError:
                what = getattr(op, "pod", None) or op.jobset
                self.log(f"{what} changed meanwhile: its update was refused; the next round decides again")
            except HotswapError as error:
                if type(error) is KubernetesError:  # the server's own failure (5xx, 429), not a refusal
                    self.training.interrupted()
                self.log(f"warning: {error}")
        return enactment.refused

    def _record_failed_runs(self, observation: Observation) -> None:
        """Write down the runs seen ended FAILED, before anyone deletes their JobSets, so that no
        machine's ``workload create`` resumes one (:mod:`~hotswap.backends.kubernetes.failed_runs`).
        An error is a warning (a Role of an earlier release's: once); the next round tries again."""
        try:
            for key in self.failed_runs.record(observation.jobsets.values(), observation.now):
                self.log(f"recorded failed run {key} in ConfigMap {self.failed_runs.name}")
        except UnreachableError:
            raise
        except ForbiddenError as error:
            if not self.failed_runs.refused:
                self.log(f"warning: {error}; failed runs are not recorded in the cluster (apply `hotswap controller manifests` again)")
            self.failed_runs.refused = True
        except HotswapError as error:
            self.log(f"warning: {error}")
        else:
            self.failed_runs.refused = False

    def _account(
        self, observation: Observation, decision: Decision, effects: list[ActionEffect], refused: set[str], seconds: float,
        writes: int,
    ) -> None:
        """The figures of this round (:mod:`hotswap.backends.kit.figures`). A decision whose
        record was refused was not carried out: it is not counted (the round that commits it is)."""
        if self.figures is None:
            return
        counted_effects = [e for e in effects if e.action.workload not in refused]
        counted = [name for name in observation.jobsets if name not in refused]
        records = {name: observation.jobsets[name].record for name in counted}
        before = {name: record.workload.preemptions if record is not None else None for name, record in records.items()}
        after = {name: decision.snapshot.workloads.get(name) or observation.outside.get(name) for name in counted}
        self.figures.account_round(
            counted_effects, before, after, decision.snapshot, observation.now,
            seconds=seconds, writes=writes, loss_since=observation.loss_since,
        )
        managed = {name: w for name, w in decision.snapshot.workloads.items() if name in observation.jobsets}

        def running(workload: Workload) -> int:
            """How many pods of the workload's current attempt run."""
            return sum(1 for p in observation.pods_of(workload.name) if p.running and p.attempt == workload.attempt)

        self.figures.check_recoveries(managed, running, observation.now, self.training.first_step)

    # ------------------------------------------------------------------ the loop

    def run(self, stop: threading.Event, identity: str, elector: LeaderElector | None = None) -> None:
        elector = elector or LeaderElector(self.client, identity, log=self.log)
        self.may_act = elector.may_act
        changed = threading.Event()
        threads = [
            threading.Thread(target=self.client.watch, args=(kind, self.cluster, changed, stop), kwargs={"log": self.log},
                             name=f"watch-{kind}", daemon=True)
            for kind in ("nodes", "jobsets", "pods")
        ]
        threads.append(threading.Thread(target=self._lead, args=(elector, stop, changed), name="lease", daemon=True))
        # Stopping must wake the loop at once, wherever it waits.
        threads.append(threading.Thread(target=lambda: (stop.wait(), changed.set()), name="stop", daemon=True))
        for thread in threads:
            thread.start()
        next_resync = 0.0
        retry_at = 0.0
        failures = 0
        last_error = None
        try:
            while not stop.is_set():
                now = time.monotonic()
                wake = self._wake_due()
                if elector.may_act() and now >= retry_at and (changed.is_set() or now >= next_resync or wake):
                    stop.wait(DEBOUNCE_S)
                    changed.clear()
                    try:
                        self.reconcile()
                        if last_error is not None:
                            self.log("reconcile: working again")
                        failures, last_error = 0, None
                    except HotswapError as error:
                        failures += 1
                        delay = min(2.0 ** (failures - 1), MAX_BACKOFF_S)
                        if error.message != last_error:
                            self.log(f"warning: reconcile: {error}; retrying with backoff")
                            last_error = error.message
                        retry_at = time.monotonic() + delay
                    next_resync = time.monotonic() + RESYNC_EVERY_S
                deadlines = [next_resync, retry_at] + ([time.monotonic() + max(0.0, self.wake_at - self.clock())] if self.wake_at else [])
                changed.wait(max(0.05, min(deadlines) - time.monotonic()))
        finally:
            elector.release()
            if self.metrics is not None:
                self.metrics.leading(False)

    def _wake_due(self) -> bool:
        return self.wake_at is not None and self.clock() >= self.wake_at

    def _lead(self, elector: LeaderElector, stop: threading.Event, changed: threading.Event) -> None:
        """Renew (or try to take) the Lease every retry period, whatever the reconcile does."""
        while not stop.is_set():
            was = elector.may_act()
            leading = elector.tick()
            if self.metrics is not None:
                self.metrics.leading(leading)
            if leading and not was:
                changed.set()  # a new leader reconciles at once
            stop.wait(RETRY_PERIOD_S)
