"""A run's checkpoint directory as a worker sees it: seed 004's ``signal`` file (what a new run
may resume from) and where this run's state comes from while it has no checkpoint of its own.

The values and the rule are the worker contract's (:mod:`hotswap.api.runs`: ``RUN_*``,
:func:`~hotswap.api.runs.pending_migration`); this module reads and writes the files.
Framework-neutral: the PyTorch and the JAX SDK both use it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from pathlib import Path

from hotswap.api.runs import (
    RESUME_AUTO, RUN_FAILED, RUN_OUTCOME_FILE, RUN_OWNER_FILE, RUN_RUNNING, RUN_SIGNAL_FILE, foreign_migration, own_runs,
    pending_migration, run_signal_after, run_state,
)
from hotswap.api.worker import WorkerEnv
from hotswap.train.files import write_file_durably

log = logging.getLogger("hotswap.train")
_MAX_SIGNAL_BYTES = 64


def mark(run_dir: Path, state: str) -> None:
    """Replace the run's signal atomically (a reader sees the old or the new one, whole), its
    writer's name beside it the first time (:data:`~hotswap.api.runs.RUN_OWNER_FILE`)."""
    if not os.path.lexists(run_dir / RUN_OWNER_FILE):
        _replace(run_dir, RUN_OWNER_FILE, WorkerEnv.from_environ(os.environ).workload)
    _replace(run_dir, RUN_SIGNAL_FILE, state)


def _replace(run_dir: Path, name: str, value: str) -> None:
    temporary = run_dir / f".{name}.{uuid.uuid4().hex[:8]}"
    try:
        write_file_durably(temporary, f"{value}\n".encode())
        os.replace(temporary, run_dir / name)
    except OSError as error:  # the checkpoint itself is saved; say why the signal is not
        log.warning("hotswap: cannot write %s: %s", run_dir / name, error.strerror or error)
        with contextlib.suppress(OSError):
            temporary.unlink()


def mark_saved(run_dir: Path, reason: str) -> None:
    """After a committed checkpoint saved for ``reason`` (termination: a migration waits)."""
    mark(run_dir, run_signal_after(reason))


def mark_running(run_dir: Path) -> None:
    """The run has started: an earlier run's migration checkpoint is no longer pending."""
    mark(run_dir, RUN_RUNNING)


def read_signal(run_dir: Path, name: str = RUN_SIGNAL_FILE) -> str | None:
    try:
        with open(run_dir / name, "rb") as handle:
            return handle.read(_MAX_SIGNAL_BYTES).decode(errors="replace").strip() or None
    except OSError:
        return None


def read_writer(run_dir: Path) -> str | None:
    """The workload that wrote the run (None: it names none, an earlier release's run)."""
    return read_signal(run_dir, RUN_OWNER_FILE)


def read_state(run_dir: Path) -> str | None:
    """The run as the resume rule reads it: its signal, or failed if its backend said so."""
    return run_state(read_signal(run_dir), read_signal(run_dir, RUN_OUTCOME_FILE))


def resume_source(env: WorkerEnv) -> Path | None:
    """The directory this run restores from while its own holds no checkpoint: the one the
    backend named, the predecessor's migration checkpoint (``auto``), or None (a fresh start)."""
    if not env.resume_from:
        return None
    if env.resume_from != RESUME_AUTO:
        return Path(env.resume_from)
    if not env.checkpoint_dir:
        return None
    own = Path(env.checkpoint_dir)
    try:
        siblings = [entry for entry in own.parent.iterdir() if entry.is_dir() and entry.name != own.name]
    except OSError:
        return None
    failed = set(env.failed_runs)  # ended FAILED as the backend saw it (Kubernetes: no outcome file)
    states = {entry.name: run_state(read_state(entry), RUN_FAILED) if entry.name in failed else read_state(entry) for entry in siblings}
    writers = {entry.name: read_writer(entry) for entry in siblings}
    run = pending_migration(own_runs(states, writers, env.workload))
    foreign = foreign_migration(states, writers, env.workload) if run is None else None
    if foreign is not None:
        log.warning(
            "hotswap: starting fresh: run %s under %s is %s, not workload %s's (--resume-from %s resumes it)",
            foreign, own.parent, _whose(writers.get(foreign)), env.workload, foreign,
        )
    return own.parent / run if run else None


def _whose(writer: str | None) -> str:
    return f"workload {writer}'s" if writer else "an earlier release's, naming no workload"
