"""Runs, why a worker generation starts, and which checkpoint a new run resumes from.

Each ``workload create`` starts a *run*: its own id and its own checkpoint directory under the
workload's checkpoint root (the worker gets both, :data:`~hotswap.api.worker.HOTSWAP_RUN_ID`
and :data:`~hotswap.api.worker.HOTSWAP_CHECKPOINT_DIR`). The rules here decide, from the
``signal`` file each run's directory holds, whether a new run resumes from its predecessor;
backends and the training SDK read and write the files by them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# HOTSWAP_RESUME_FROM's value that has the worker look for a migration checkpoint its
# predecessor left next to its own directory (Kubernetes, where only pods see the volume).
RESUME_AUTO = "auto"

# A run's id sorts in creation order. A run's directory holds seed 004's ``signal`` file, written
# by its workers: RUN_RESUME after a save on SIGTERM (deleted or preempted mid-run: a migration
# checkpoint waits), RUN_RUNNING once it has started or restored, RUN_DONE after its final save.
# A worker cannot tell why it got SIGTERM (a hang kill, or the collateral stop of a failed
# attempt, is one too), so the backend that ended the run FAILED says so in RUN_OUTCOME_FILE,
# a file of its own (never raced by a worker's save): such a run reads as RUN_FAILED. A new run
# resumes automatically only from the newest run that has a signal, and only if that signal is
# RUN_RESUME: never from a finished or failed run.
RUN_SIGNAL_FILE = "signal"
RUN_OUTCOME_FILE = "outcome"
# Beside the signal, the workers write the name of the workload the run belongs to (its
# writer). Several workloads may share one checkpoint root (--checkpoint-dir): a new run takes
# over only its own workload's runs; another's (or one that names no writer: an earlier
# release's) is resumed only when the user names it (--resume-from).
RUN_OWNER_FILE = "workload"
RUN_RESUME = "resume"
RUN_RUNNING = "running"
RUN_DONE = "done"
RUN_FAILED = "failed"
_RUN_ID = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")  # UTC creation time, 6 random hex digits


def is_run_id(text: str) -> bool:
    return bool(_RUN_ID.match(text))


def run_signal_after(reason: str) -> str:
    """The signal a run's directory holds after a checkpoint saved for ``reason``."""
    return {"termination": RUN_RESUME, "final": RUN_DONE}.get(reason, RUN_RUNNING)


def run_state(signal: str | None, outcome: str | None) -> str | None:
    """A run as the resume rule reads it, from its workers' ``signal`` and its backend's
    ``outcome`` (None: no such file): RUN_FAILED if the backend ended it failed and it started,
    else its signal (None: it never got to start)."""
    signal = (signal or "").strip() or None
    return RUN_FAILED if signal and (outcome or "").strip() == RUN_FAILED else signal


def predecessor(states: Mapping[str, str | None]) -> tuple[str, str] | None:
    """The newest earlier run that got to start and its state (see :func:`run_state`), given
    each earlier run's; None when none started."""
    started = sorted(run for run, state in states.items() if state and is_run_id(run))
    return (started[-1], (states[started[-1]] or "").strip()) if started else None


def pending_migration(states: Mapping[str, str | None]) -> str | None:
    """The run whose migration checkpoint a new run resumes from, given each earlier run's state
    (:func:`run_state`) of its own workload (:func:`own_runs`): the newest run that got to
    start, if it says resume."""
    newest = predecessor(states)
    return newest[0] if newest is not None and newest[1] == RUN_RESUME else None


def own_runs(states: Mapping[str, str | None], writers: Mapping[str, str | None], workload: str) -> dict[str, str | None]:
    """The runs among ``states`` that ``workload`` wrote (``writers``: each run's owner file,
    None where it has none); the resume rule looks at no other."""
    return {run: state for run, state in states.items() if writers.get(run) == workload}


def foreign_migration(states: Mapping[str, str | None], writers: Mapping[str, str | None], workload: str) -> str | None:
    """The pending migration under the root that another workload (or an earlier release,
    naming none) left, newest first: passed over by ``workload``'s new run, which says so."""
    others = {writers.get(run) for run in states} - {workload}
    pending = (pending_migration({run: state for run, state in states.items() if writers.get(run) == other}) for other in others)
    return max((run for run in pending if run), default=None)


# Why a worker generation started: its first start, a restart after a node failure (onto other
# slices), after a worker failure or hang (same slices), re-admission after preemption, a
# replica joining an elastic workload that grows back, a new run resuming its predecessor.
CAUSE_ELASTIC = "elastic"  # a replica joining an elastic workload that grows back
START_CAUSES = ("start", "hotswap", "failure", "preemption", CAUSE_ELASTIC, "resume")
