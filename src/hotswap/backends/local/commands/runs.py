"""What a new local run resumes from, decided once at ``workload create`` and pinned in its
launch record (so ``workload describe`` and the workers agree, whatever happens later).

The rule is the worker contract's (:func:`hotswap.api.runs.pending_migration`): the
predecessor's migration checkpoint (a run of the same workload: several may share a
``--checkpoint-dir`` root), only if it left one on SIGTERM and its controller did not
end it failed (a hang kill is a SIGTERM too: the outcome file says what the workers cannot);
``--resume-from`` names a run or a directory; ``--fresh`` takes nothing. The checkpoints are on this machine, so the CLI
reads the runs' signal files itself (on Kubernetes only the pods see the volume, and the
workers decide).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hotswap.api.errors import InvalidInputError
from hotswap.api.launch import RUN_FRESH, RUN_FROM, Launch, Run
from hotswap.api.runs import (
    RUN_FAILED, RUN_OUTCOME_FILE, RUN_OWNER_FILE, RUN_RESUME, RUN_SIGNAL_FILE, foreign_migration, is_run_id, own_runs, predecessor,
    run_state,
)
from hotswap.store.paths import ClusterPaths, check_private
from hotswap.backends.local.tables import LIVE_WORKER_STATES, LocalStore

if TYPE_CHECKING:  # pydantic loads only where specs are built or validated: reads stay fast
    from hotswap.api.spec import WorkloadSpec

_MAX_SIGNAL_BYTES = 64


PREDECESSOR_EXIT_SLACK_S = 5.0  # beyond its grace period, for a deleted predecessor's workers to exit


def resolve_new(paths: ClusterPaths, spec: WorkloadSpec, launch: Launch) -> Run:
    """:func:`resolve` for ``workload create``: the checkpoint root is the parent of the run's
    directory; a predecessor of the same name still saving on SIGTERM is waited for, at most its
    grace period and a little."""

    def predecessor_stopped() -> bool:
        with LocalStore.open(paths.database) as store:
            return not store.worker_rows.select(LIVE_WORKER_STATES, workload=spec.name)

    wait_s = spec.termination_grace_period_s + PREDECESSOR_EXIT_SLACK_S
    assert launch.run is not None
    return resolve(launch.run, Path(launch.checkpoint_dir).parent, predecessor_stopped, wait_s, spec.name)


def resolve(run: Run, root: Path, predecessor_stopped: Callable[[], bool], wait_s: float, workload: str) -> Run:
    """``run`` (from ``new_run``) of ``workload`` with ``resume_from`` (the directory its workers restore from
    while they have no checkpoint of their own, "" for none) and ``resumed_from`` (for people:
    run, path, kind; None for a fresh start). ``predecessor_stopped`` says whether the workers
    of the last workload of this name have all exited; a migration save ends with their exit,
    so an automatic choice waits for it (at most ``wait_s``)."""
    if run.mode == RUN_FRESH:
        return run.resolved("", None)
    if run.mode == RUN_FROM:
        source = str(run.source)
        path = root / source if is_run_id(source) else Path(source).expanduser().absolute()
        if not path.is_dir():
            raise InvalidInputError(
                f"--resume-from {source}: no such run under {root} and no such directory"
                if is_run_id(source) else f"--resume-from {source}: {path} is not a directory"
            )
        # Its checkpoints are restored into the job: nobody else may be able to write them.
        check_private(path, "--resume-from", remedy="use a directory of yours", error=InvalidInputError)
        origin = {"run": path.name if is_run_id(path.name) else None, "path": str(path), "kind": "explicit"}
        return run.resolved(str(path), origin)
    deadline = time.monotonic() + wait_s
    while not predecessor_stopped() and time.monotonic() < deadline:
        time.sleep(0.1)
    states = _states(root, exclude=run.id)
    writers = {name: _read(root / name / RUN_OWNER_FILE) for name in states}
    newest = predecessor(own_runs(states, writers, workload))
    name, state = newest if newest is not None else ("", None)
    path = root / name
    if state == RUN_FAILED:  # its workers' SIGTERM save says resume; its controller knows better
        return run.resolved("", None, not_resumed={"run": name, "path": str(path), "reason": "failed"})
    if state == RUN_RESUME:
        return run.resolved(str(path), {"run": name, "path": str(path), "kind": "migration"})
    foreign = foreign_migration(states, writers, workload)
    if foreign is not None:  # another workload's under a shared root: it is not this one's to take
        reason = f"is workload {writers[foreign]}'s" if writers[foreign] else "names no workload (an earlier release's)"
        return run.resolved("", None, not_resumed={"run": foreign, "path": str(root / foreign), "reason": reason})
    return run.resolved("", None)


def _states(root: Path, exclude: str) -> dict[str, str | None]:
    """Each earlier run under ``root`` as the resume rule reads it (``api.runs.run_state``)."""
    try:
        entries = [entry for entry in root.iterdir() if entry.name != exclude and is_run_id(entry.name) and entry.is_dir()]
    except OSError:
        return {}
    return {entry.name: run_state(_read(entry / RUN_SIGNAL_FILE), _read(entry / RUN_OUTCOME_FILE)) for entry in entries}


def _read(path: Path) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(_MAX_SIGNAL_BYTES).decode(errors="replace").strip() or None
    except OSError:
        return None
