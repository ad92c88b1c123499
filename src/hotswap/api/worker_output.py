"""What a worker reports: the log lines people and scripts parse, and its goodput events.

Step numbers count from 1: ``step=N`` is the N-th step done, a checkpoint of step N holds the
state after N steps, and ``restored step=N`` is followed by step N+1.
"""

from __future__ import annotations

import json

from hotswap.api.runs import START_CAUSES


def step_line(step: int, good_slice_count: int, elastic_down_event_count: int, **extra: object) -> str:
    """The per-step log line Pathways elastic users already parse (seed 001's awk script)."""
    fields = [
        f"step={step}",
        f"elastic_manager.good_slice_count={good_slice_count}",
        f"elastic_manager.elastic_down_event_count={elastic_down_event_count}",
    ]
    fields += [f"{key}={value}" for key, value in extra.items()]
    return " ".join(fields)


# Where restored state came from: a checkpoint on disk, a migration checkpoint (saved on SIGTERM
# for the move that this start completes), a surviving replica. Extended compatibly: the
# ``cause=`` field (START_CAUSES) says what happened; parsers that read step= and source= only
# (seeds 001, 004) read the same line as before.
RESTORE_SOURCES = ("checkpoint", "migration", "peer")


def restore_source(checkpoint_reason: str | None, cause: str | None) -> str:
    """The source a restore from disk reports: a checkpoint saved on SIGTERM is a migration,
    except after a worker failure (the crash, not the earlier move, is why state is read)."""
    return "migration" if checkpoint_reason == "termination" and cause != "failure" else "checkpoint"


def restored_line(step: int, source: str, cause: str | None = None) -> str:
    """The line a worker prints once when it restores state."""
    if source not in RESTORE_SOURCES:
        raise ValueError(f"restore source must be one of {RESTORE_SOURCES}, not {source!r}")
    if cause is not None and cause not in START_CAUSES:
        raise ValueError(f"restore cause must be one of {START_CAUSES}, not {cause!r}")
    return f"restored step={step} source={source}" + (f" cause={cause}" if cause else "")


def parse_fields(line: str) -> dict[str, str]:
    """``key=value`` fields of a log line (other words are ignored)."""
    fields: dict[str, str] = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep:
            fields[key] = value
    return fields


# Goodput events: each worker appends JSON lines {"t": <unix seconds>, "kind": <kind>, ...} to
# $HOTSWAP_EVENTS_FILE; the controller reads them to account goodput (hotswap.core.goodput).
# process started: {"attempt", "rank", "world_size", "process_t"}; t: the run was created (the
# script has imported its modules); process_t: the process began (a warm spare: was handed over).
EVENT_START = "start"
# a training step finished: {"step", "duration_s", "slices"}; a process's first step also has
# "formed_t" (its group was formed) and "restored_t" (its state was restored or received).
EVENT_STEP = "step"
EVENT_CHECKPOINT_SAVE = "checkpoint_save"  # {"step", "blocking_s", "total_s", "bytes", "reason"}
# A save that holds the training loop is starting: {"step", "reason"}. Until its checkpoint_save
# (or a later step) no step completes, and hang detection must not count that as a hang.
EVENT_CHECKPOINT_BEGIN = "checkpoint_begin"
EVENT_CHECKPOINT_RESTORE = "checkpoint_restore"  # {"step", "duration_s", "source"}
# membership change applied: {"generation", "slices", "duration_s", "cause"}; cause: membership (a
# published generation) or peer_failure (a collective failed), then with "timed_out": whether the
# lost peer was noticed only when a collective timed out (a hang) rather than by its connections.
EVENT_ELASTIC = "elastic"
EVENT_STOP = "stop"  # the worker leaves: {"step", "reason", "exit_code"}; reasons: complete,
# terminated, removed, peer_lost, no_membership, rendezvous_failed, checkpoints_unusable,
# final_save_failed (the last step is done, its checkpoint could not be written: a non-zero exit).
# checkpoint_save reasons: periodic, termination, final, recovery (only the writing rank records
# saves).
# The saves a worker writes on its way out (after its last step; on SIGTERM): hang detection
# judges them by no step's deadline.
LEAVING_SAVE_REASONS = ("final", "termination")
EVENT_KINDS = (
    EVENT_START,
    EVENT_STEP,
    EVENT_CHECKPOINT_SAVE,
    EVENT_CHECKPOINT_BEGIN,
    EVENT_CHECKPOINT_RESTORE,
    EVENT_ELASTIC,
    EVENT_STOP,
)


def event_record(kind: str, t: float, **fields: object) -> str:
    """One line of the events file."""
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown goodput event kind {kind!r}")
    return json.dumps({"t": t, "kind": kind, **fields}, sort_keys=True)
