"""What a decision's actions do to a local cluster's workers: the local twin of the Kubernetes
backend's plan and enactment.

:func:`plan` is pure: one action's effect, the workload it names and that workload's live worker
rows give a :class:`WorkerPlan` (rows to stop, a new membership generation, workers to start as
the replica indexes the core assigned them).
:class:`Launcher` turns a plan's starts into :class:`WorkerLaunch` es inside the round's
transaction (it stages the generation, with a fresh rendezvous port, first). The controller
commits both before any process is signalled or started (see ``workers/lifecycle.py``), and
only then publishes the staged generation to the workers (:meth:`Launcher.publish_committed`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from hotswap.api import worker as contract
from hotswap.api.launch import HeldStart, Launch, Run
from hotswap.api.membership import Membership
from hotswap.api.catalog import AcceleratorKind, get_device_type
from hotswap.backends.local import workload_files
from hotswap.backends.local.crash_points import crash_at
from hotswap.backends.local.gpu.backing import Backing
from hotswap.backends.local.workers import environment
from hotswap.backends.local.workers.supervisor import LocalProcess, WorkerLaunch
from hotswap.core.effects import ActionEffect, Stop, with_resume
from hotswap.core.model import Snapshot
from hotswap.core.workload import Workload
from hotswap.store.paths import ClusterPaths, new_dirs_private
from hotswap.backends.local.tables import LocalStore, WorkerIdentity, WorkerRow


@dataclasses.dataclass(frozen=True)
class WorkerPlan:
    """The worker effects of one action."""

    stop: tuple[WorkerRow, ...] = ()  # gracefully: SIGTERM, SIGKILL after the grace period
    generation: tuple[str, ...] | None = None  # a new membership generation of these active slices
    start: tuple[str, ...] = ()  # slices whose workers start...
    slices: tuple[str, ...] = ()  # ...in a workload running on these slices
    indexes: tuple[int, ...] = ()  # ...the replica index of each started slice (JOB_INDEX)
    attempt: int = 0  # ...in this attempt
    cause: str | None = None  # ...because of this (START_CAUSES), None when not known


def plan(effect: ActionEffect, workload: Workload, live: Sequence[WorkerRow]) -> WorkerPlan:
    """The worker effects of an action on ``workload``, whose live workers are ``live``: the
    core's :class:`~hotswap.core.effects.ActionEffect` (computed once per action), on these
    rows. Each started slice runs the replica the effect assigns it."""
    return WorkerPlan(
        stop=_stopping(effect, live),
        generation=effect.generation,
        start=effect.start,
        slices=effect.generation or () if effect.start else (),
        indexes=tuple(effect.replica_of(slice_) for slice_ in effect.start),
        attempt=effect.attempt if effect.attempt is not None else workload.attempt if effect.start else 0,
        cause=effect.cause,  # a held-back restart's: the Launcher keeps it for the StartWorkers to come
    )


def _stopping(effect: ActionEffect, live: Sequence[WorkerRow]) -> tuple[WorkerRow, ...]:
    """The live workers the effect stops, except those already told to stop."""
    stop = effect.stop
    if stop is Stop.NONE:
        return ()
    if stop is Stop.OLDER:
        attempt = effect.attempt or 0
        return tuple(w for w in live if w.state != "stopping" and w.identity.attempt < attempt)
    if stop is Stop.REMOVED:
        removed = set(effect.removed)
        return tuple(w for w in live if w.state != "stopping" and w.identity.slice in removed)
    return tuple(w for w in live if w.state != "stopping")


class Launcher:
    """The launches of a plan's starts, built in the round's open transaction. On a GPU-backed
    cluster (``backing``) each host's worker sees only its GPUs and runs a process per GPU."""

    def __init__(self, store: LocalStore, paths: ClusterPaths, backing: Callable[[], Backing | None] = lambda: None) -> None:
        self.store = store
        self.paths = paths
        self.backing = backing
        self.staged: dict[str, Path] = {}  # workload -> its directory, with a generation staged

    def publish_committed(self, workloads: Iterable[Workload] = ()) -> None:
        """Publish the generations staged for ``workloads`` and by the last round, where the
        database committed them; drop those whose round rolled back (see
        :func:`~hotswap.backends.local.workload_files.stage_membership`)."""
        staged = {**self.staged, **{w.name: self.paths.workload_dir(w.name, w.seq) for w in workloads}}
        self.staged = {}
        for name, directory in staged.items():
            workload_files.publish_staged_membership(directory, self.store.launches.membership(name)[0])

    def launches(self, workload: Workload, plan: WorkerPlan, snapshot: Snapshot) -> list[WorkerLaunch]:
        if plan.generation is not None:
            self._publish(workload, plan.generation, snapshot)
        if not plan.start:
            if plan.cause is not None:  # a restart whose workers are held back (BlockingRecreate, a repair)
                self.store.launches.set_held_start(workload.name, HeldStart(plan.attempt, plan.cause))
            return []
        _, port = self.store.launches.membership(workload.name)
        launch = self.store.launches.get(workload.name)
        run = launch.run
        cause = plan.cause or _held_cause(launch, plan.attempt)
        if launch.held_start is not None:
            self.store.launches.set_held_start(workload.name, None)
        run_env = _run_environment(run, _start_cause(cause, run))
        self._checkpoint_dir(workload, Path(launch.checkpoint_dir))
        directory = self.paths.workload_dir(workload.name, workload.seq)
        elastic = workload.spec.min_slices is not None
        tpu = get_device_type(workload.spec.device_type).kind is AcceleratorKind.TPU
        backing = self.backing()
        launches = []
        for slice_, replica in zip(plan.start, plan.indexes, strict=True):
            nodes = snapshot.slices[slice_].nodes
            for host, node in enumerate(nodes):
                gpus = tuple(g.index for g in backing.host_gpus(slice_, host)) if backing else ()
                log = workload_files.log_path(directory, replica, host)
                env = environment.worker_environment(
                    base=launch.start_environment,
                    user=environment.user_variables(workload.spec),
                    cluster=self.paths.name,
                    workload=workload.name,
                    slices=plan.slices,
                    num_slices=workload.spec.num_slices,
                    replica=replica,
                    slice_name=slice_,
                    host=host,
                    hosts_per_slice=len(nodes),
                    attempt=plan.attempt,
                    master_port=port,
                    checkpoint_dir=launch.checkpoint_dir,
                    events_file=None,  # one per worker process, set with its row
                    grace_s=workload.spec.termination_grace_period_s,
                    membership_file=workload_files.membership_path(directory) if elastic else None,
                    gpus=gpus,
                    tpu=tpu,
                )
                env.update(run_env)
                identity = WorkerIdentity(workload.name, workload.seq, plan.attempt, slice_, replica, host, node)
                others = tuple(
                    LocalProcess(environment.local_process_environment(env, rank), workload_files.local_log_path(log, rank))
                    for rank in range(1, len(gpus))
                )
                launches.append(
                    WorkerLaunch(
                        identity,
                        dir=directory / "workers",  # one per worker process, set with its row
                        log=log,
                        command=workload.spec.command,
                        cwd=launch.cwd,
                        env=env,
                        local=others,
                    )
                )
        return launches

    def _checkpoint_dir(self, workload: Workload, path: Path) -> None:
        """Create the checkpoint directory, owner-only (training state is the owner's alone).
        ``workload create`` checked that it can be; one that broke since must not stop the
        cluster's decisions: the workers start (their checkpoints fail) and the timeline says why."""
        try:
            new_dirs_private(path)
        except OSError as error:
            message = f"cannot create the checkpoint directory {path}: {error.strerror or error}"
            self.store.record_event(time.time(), "warning", message, workload.name, workload.seq)

    def _publish(self, workload: Workload, slices: tuple[str, ...], snapshot: Snapshot) -> None:
        """A new membership generation with its own rendezvous port (the file: elastic workloads)."""
        generation, _ = self.store.launches.membership(workload.name)
        port = environment.free_port()
        generation += 1
        self.store.launches.set_membership(workload.name, generation, port)
        if workload.spec.min_slices is not None:
            hosts = len(snapshot.slices[slices[0]].nodes) if slices else 1
            backing = self.backing()
            per_host = backing.per_host if backing else 1
            directory = self.paths.workload_dir(workload.name, workload.seq)
            joined = directory / "joined"  # joiners' readiness marks (see Membership.joined_dir)
            new_dirs_private(joined)
            workload_files.stage_membership(
                directory,
                Membership(generation, tuple(slices), hosts, environment.MASTER_ADDR, port, per_host, str(joined)),
            )
            self.staged[workload.name] = directory
            crash_at("staged")  # (test-only: see crash_points.py)


def _held_cause(launch: Launch, attempt: int) -> str | None:
    """The cause a held-back restart recorded for ``attempt`` (committed with its round, so a
    controller restarted before the workers start still knows why they start)."""
    held = launch.held_start
    return held.cause if held is not None and held.attempt == attempt else None


def _start_cause(cause: str | None, run: Run | None) -> str | None:
    """Why this generation of workers starts (``HOTSWAP_START_CAUSE``): a run's first start
    that takes its state from elsewhere resumes."""
    return with_resume(cause, bool(run and run.resume_from))


def _run_environment(run: Run | None, cause: str | None) -> dict[str, str]:
    """The run's part of the worker contract (none for a workload of an earlier release)."""
    env = {contract.HOTSWAP_START_CAUSE: cause} if cause else {}
    if run:
        env[contract.HOTSWAP_RUN_ID] = run.id
        env[contract.HOTSWAP_RESUME_FROM] = run.resume_from or ""
    return env
