"""The ``hotswap.dev/state`` annotation: what only the core knows about a workload (queue order,
attempts, preemptions, the slice each replica runs on), kept on its JobSet so that the controller
stays stateless. The controller writes it; every reconcile, and a new leader, reads it back.

It is read once, where a JobSet enters (:func:`~.live_objects.read_jobset`), into a
:class:`StateRecord`, and written back as :meth:`StateRecord.encode`: the store's JSON of the
core's :class:`~hotswap.core.workload.Workload` without its spec (the spec has its own
annotation), its replica map (``replicas``) with one entry per replica index of the JobSet, plus
keys of the Kubernetes backend: the seconds spent in each phase (for ``describe``'s goodput), and
the workers whose pods the controller has released for the current attempt, by child Job and
completion index (``{"<job uid>": "0-3"}``): a gated pod for one of those replaces a worker that
is gone, even if its pod vanished while no controller was looking; why the current attempt
started (``start_cause``, given to its pods when they are released); and the child Jobs of an
earlier attempt that a restart, preemption or scale-down retires (``retiring``: ``{"<job uid>":
"<job name>"}``), recorded in the same write as the decision and deleted after it, by UID
(:mod:`.child_jobs`). Keys sorted: the same record is always the same text.

Anyone can edit an annotation. Text that is not a JSON object, a record without one of the
workload's fields or with one of the wrong type reads as no record (the JobSet is a new
workload: ``WorkloadCreated``), never as an error that would stop every reconcile; the
Kubernetes keys and the replica map read leniently (what is not theirs reads as empty, or as the
map of the slices).

Versions, by shape: every release so far wrote the same record and only added keys, each of
them optional on read (the first release: the workload, ``replicas``, ``phase_seconds`` and
``phase_since``; then ``released_jobs``, then ``start_cause``, then ``retiring``, then
``failures``: each failure under the workload, ``[loss began, attempt]``, for MTTR; since the
core decides the replica map, ``replicas`` is its map, in the same form). So one reader reads
every release's record (``tests/test_kubernetes_state_record.py`` holds one of each, as it
wrote it), and this release writes the text the previous one did: an upgrade rewrites no
annotation, and the idempotence of a reconcile is the text's. No ``version`` key is written: it
would change every annotation once on upgrade for nothing to tell apart. A later change that
is not an added, optional key writes one (absent: this shape). Keys this release does not know
are not kept: they go when the record is next written.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hotswap.api.runs import START_CAUSES
from hotswap.core.workload import Workload
from hotswap.store.codec import check_fields, workload_fields, workload_from_fields

if TYPE_CHECKING:
    from hotswap.api.spec import WorkloadSpec

Released = Mapping[str, frozenset[int]]  # child Job uid -> completion indexes released
Retiring = Mapping[str, str]  # child Job uid -> its name: Jobs of an earlier attempt, to delete


@dataclasses.dataclass(frozen=True)
class StateRecord:
    """The state annotation of one JobSet, typed."""

    workload: Workload
    phase_seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)  # phases closed so far
    phase_since: float | None = None  # when the current phase began (None: not recorded)
    released: Released = dataclasses.field(default_factory=dict)  # never an empty set of indexes
    start_cause: str | None = None  # one of START_CAUSES
    retiring: Retiring = dataclasses.field(default_factory=dict)
    failures: tuple[tuple[float, int], ...] = ()  # (loss began, attempt running then), the last MAX_FAILURES

    def to_json(self) -> dict[str, Any]:
        """The annotation's JSON object."""
        record = workload_fields(self.workload)
        record["replicas"] = replica_slots(self.workload)
        if self.start_cause:
            record["start_cause"] = self.start_cause  # why the current attempt started (HOTSWAP_START_CAUSE)
        if self.released:
            record["released_jobs"] = {uid: _ranges(sorted(hosts)) for uid, hosts in sorted(self.released.items())}
        if self.retiring:
            record["retiring"] = dict(sorted(self.retiring.items()))
        if self.failures:
            record["failures"] = [[t, attempt] for t, attempt in self.failures]
        record["phase_seconds"] = dict(self.phase_seconds)
        if self.phase_since is not None:
            record["phase_since"] = self.phase_since
        return record

    def encode(self) -> str:
        """The annotation's text."""
        return json.dumps(self.to_json(), sort_keys=True)

    def written_as(self, other: StateRecord | None) -> bool:
        """Whether the two are the same annotation: a round whose record is the one it read
        writes nothing. (Compared as written: the core's workload may carry what the record
        does not keep.)"""
        return other is not None and (other is self or self.to_json() == other.to_json())


def decode_state(text: str, spec: WorkloadSpec) -> StateRecord | None:
    """The record of the workload of ``spec`` in the annotation's text, or None when the text is
    not one (not a JSON object, a workload field missing or of the wrong type)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        check_fields(data)
        workload = workload_from_fields(data, spec)
    except (KeyError, TypeError, ValueError):
        return None
    return StateRecord(
        workload=workload,
        phase_seconds=_ledger(data.get("phase_seconds")),
        phase_since=_time(data.get("phase_since")),
        released=_released(data.get("released_jobs")),
        start_cause=_start_cause(data.get("start_cause")),
        retiring=_retiring(data.get("retiring")),
        failures=_failures(data.get("failures")),
    )


def state_of(
    workload: Workload, previous: StateRecord | None, now: float,
    released: Released | None = None, start_cause: str | None = None, retiring: Retiring | None = None,
    loss_began: float | None = None,
) -> StateRecord:
    """The record of a workload after a round: the core's decided workload, and the seconds
    spent in each phase so far (closed at every phase change, so the annotation is rewritten
    only when something happens); a failure under it (a restart for a loss or a worker's
    failure, or an elastic shrink) is kept with when the loss began (``loss_began``, else now):
    MTTR runs from it to the workers' first step after it."""
    ledger = dict(previous.phase_seconds) if previous is not None else {}
    since = previous.phase_since if previous is not None and previous.phase_since is not None else now
    if previous is not None and previous.workload.phase is not workload.phase:
        old_phase = previous.workload.phase.value
        ledger[old_phase] = ledger.get(old_phase, 0.0) + max(0.0, now - since)
        since = now
    return StateRecord(
        workload=workload,
        phase_seconds=ledger,
        phase_since=since,
        released={uid: frozenset(hosts) for uid, hosts in (released or {}).items() if hosts},
        start_cause=start_cause or None,
        retiring=dict(retiring or {}),
        failures=_failures_after(workload, previous, now if loss_began is None else min(loss_began, now), start_cause),
    )


MAX_FAILURES = 16


def _failures_after(workload: Workload, previous: StateRecord | None, began: float, cause: str | None) -> tuple[tuple[float, int], ...]:
    if previous is None:
        return ()
    before = previous.workload
    restarted = workload.attempt > before.attempt and before.phase.holds_slices and cause in ("hotswap", "failure")
    shrunk = workload.attempt == before.attempt and len(workload.slices) < len(before.slices) and workload.phase is before.phase
    if not (restarted or shrunk):
        return previous.failures
    return (previous.failures + ((round(began, 6), before.attempt),))[-MAX_FAILURES:]


def _failures(value: object) -> tuple[tuple[float, int], ...]:
    if not isinstance(value, list):
        return ()
    found = [(float(f[0]), int(f[1])) for f in value
             if isinstance(f, list) and len(f) == 2 and isinstance(f[0], (int, float)) and isinstance(f[1], int)]
    return tuple(found[-MAX_FAILURES:])


def replica_slots(workload: Workload) -> list[str | None]:
    """The core's replica map with one entry per replica index of the JobSet: the slice its
    pods are released onto, None for a parked one."""
    replicas = list(workload.replica_map)
    return replicas + [None] * (workload.spec.num_slices - len(replicas))


def _ledger(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {phase: float(seconds) for phase, seconds in value.items() if isinstance(seconds, (int, float))}


def _time(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _start_cause(value: object) -> str | None:
    return value if isinstance(value, str) and value in START_CAUSES else None


def _released(value: object) -> dict[str, frozenset[int]]:
    if not isinstance(value, dict):
        return {}
    found = {uid: _indexes(text) for uid, text in value.items() if isinstance(text, str)}
    return {uid: hosts for uid, hosts in found.items() if hosts}


def _retiring(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {uid: name for uid, name in value.items() if isinstance(name, str)}


def _ranges(indexes: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5`` (as a Job's ``completedIndexes``)."""
    parts: list[list[int]] = []
    for index in indexes:
        if parts and parts[-1][1] == index - 1:
            parts[-1][1] = index
        else:
            parts.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def _indexes(text: str) -> frozenset[int]:
    found: set[int] = set()
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        try:
            found.update(range(int(low), int(high or low) + 1))
        except ValueError:
            return frozenset()
    return frozenset(found)
