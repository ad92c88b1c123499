"""The files of a local workload, in its directory (``workloads/<name>-<seq>/``): one log per
replica and host, one directory and one goodput events file per worker process, and the
elastic membership file. Written by the controller and the workers, read by the CLI's queries.
And the one file the controller writes in a run's checkpoint directory: the outcome of a run it
ended failed (``api.runs.RUN_OUTCOME_FILE``).
"""

from __future__ import annotations

import os
from pathlib import Path

from hotswap.api.membership import Membership
from hotswap.api.runs import RUN_FAILED, RUN_OUTCOME_FILE
from hotswap.store.paths import new_dirs_private, open_private


def log_path(workload_dir: Path, replica: int, host: int) -> Path:
    """One log per replica index and host, appended across attempts: replica 0 host 0 is
    always rank 0, so its log is the job's main log."""
    return workload_dir / "logs" / f"slice-{replica}-host-{host}.log"


def worker_dir(workload_dir: Path, worker_id: int) -> Path:
    """One directory per worker process (its row in the worker table)."""
    return workload_dir / "workers" / str(worker_id)


def events_path(workload_dir: Path, attempt: int, replica: int, host: int, worker_id: int) -> Path:
    """One goodput events file per worker process: ``<attempt>-<replica>-<host>-<worker>``."""
    return workload_dir / "events" / f"{attempt}-{replica}-{host}-{worker_id}.jsonl"


def local_events_path(events: Path, local_rank: int) -> Path:
    """The events file of local process ``local_rank`` of a worker whose events file is
    ``events`` (local rank 0's is the worker's own, which goodput reads as rank 0's)."""
    return events if local_rank == 0 else events.with_name(f"{events.name}.local{local_rank}")


def local_log_path(log: Path, local_rank: int) -> Path:
    """The log of local process ``local_rank``: local rank 0 writes the host's own log."""
    return log if local_rank == 0 else log.with_name(f"{log.stem}.local{local_rank}{log.suffix}")


def membership_path(workload_dir: Path) -> Path:
    return workload_dir / "membership.json"


def staged_membership_path(workload_dir: Path) -> Path:
    """A generation a round decided, not yet committed: workers never read it."""
    return workload_dir / "membership.json.next"


def stage_membership(workload_dir: Path, membership: Membership) -> Path:
    """Write a round's new generation beside the membership file, for :func:`publish_staged_membership`
    once the round has committed: a worker acting on a generation whose round rolled back (its
    controller killed before the commit) would leave or re-form for a decision never made."""
    return publish_membership(workload_dir, membership, staged_membership_path(workload_dir))


def publish_staged_membership(workload_dir: Path, committed_generation: int) -> None:
    """Publish the staged generation if it is the one the database committed; drop it if not
    (its round rolled back). After every commit, and by a restarted controller."""
    staged = staged_membership_path(workload_dir)
    try:
        generation: int | None = Membership.from_json(staged.read_text()).generation
    except FileNotFoundError:
        return
    except (ValueError, KeyError, TypeError):
        generation = None
    if generation == committed_generation:
        os.replace(staged, membership_path(workload_dir))
    else:
        staged.unlink(missing_ok=True)


def publish_membership(workload_dir: Path, membership: Membership, target: Path | None = None) -> Path:
    """Replace the membership file (or ``target``) atomically (workers may read it at any moment)."""
    target = target or membership_path(workload_dir)
    new_dirs_private(target.parent)
    temporary = target.with_suffix(".tmp")
    with os.fdopen(open_private(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as handle:
        handle.write(membership.to_json())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, target)
    return target


def record_run_failed(run_dir: Path) -> str | None:
    """Say in a run's checkpoint directory that the run failed, so no later run resumes it
    automatically (its workers' SIGTERM save still says ``resume``: they cannot tell a hang kill
    or a failed attempt's stop from a deletion). A run whose workers never made the directory
    left nothing to resume: nothing is written. Returns why it could not be written, or None."""
    if not run_dir.is_dir():
        return None
    target = run_dir / RUN_OUTCOME_FILE
    temporary = run_dir / f".{RUN_OUTCOME_FILE}.{os.getpid()}"
    try:
        with os.fdopen(open_private(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as handle:
            handle.write(f"{RUN_FAILED}\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except OSError as error:
        return f"cannot write {target}: {error.strerror or error}"
    return None
