"""What the workers' own records say on Kubernetes: each replica's record (its Lease, written by
its first process: :mod:`hotswap.api.worker_report`, :mod:`hotswap.train.report_channel`) read
into goodput (:func:`hotswap.core.goodput.account_run`, the local backend's categories),
recoveries and MTTR (:mod:`hotswap.core.recovery`, failure until the first productive step after
it) and each replica's progress for hang detection (:mod:`hotswap.core.hang`). Pure: the Leases,
the JobSet and the time are passed in.

The figures are as of the records: a running workload is accounted up to the newest record's
own time (its heartbeat, at most its ``interval_s`` old), never
up to when the controller happened to look; and a hang is judged by the time the worker itself
last wrote (``published_at``), so a late write, a slow API server or a loaded controller can
delay a hang's detection but never make one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hotswap.api.worker_report import REPORT_ANNOTATION, WorkerReport, decode_report
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.live_objects import LiveJobSet
from hotswap.backends.views import GoodputView
from hotswap.core.goodput import Category, Ledger, Spent, Stretch, account_run
from hotswap.core.hang import RankProgress
from hotswap.core.recovery import Recovery, StepDone, as_view, recoveries

Reports = Mapping[int, WorkerReport]  # replica index -> its record

NO_STEPS_REASON = "no step was reported: the command does not use hotswap.train (or none completed)"
NO_REPORT_REASON = "no step was reported: no replica wrote its record (its pods never ran hotswap.train, or could not write)"


def reports_by_workload(
    leases: Iterable[dict[str, Any]], parsed: dict[tuple[str, str], WorkerReport | None] | None = None,
) -> dict[str, dict[int, WorkerReport]]:
    """The records in the listed Leases, by workload and replica; a Lease anyone edited into
    something else reads as no record. ``parsed``: the records read before, by (name,
    resourceVersion): a Lease that did not change is not parsed again (kept to what was listed)."""
    found: dict[str, dict[int, WorkerReport]] = {}
    seen: dict[tuple[str, str], WorkerReport | None] = {}
    for lease in leases:
        meta = lease.get("metadata") or {}
        workload = (meta.get("labels") or {}).get(labels.WORKLOAD_LABEL)
        key = (str(meta.get("name")), str(meta.get("resourceVersion") or ""))
        if parsed is not None and key[1] and key in parsed:
            report = parsed[key]
        else:
            report = decode_report((meta.get("annotations") or {}).get(REPORT_ANNOTATION))
        seen[key] = report
        if workload and report is not None and report.attempts:
            found.setdefault(workload, {})[report.replica] = report
    if parsed is not None:
        parsed.clear()
        parsed.update(seen)
    return found


def as_of(reports: Reports, now: float) -> float:
    """The time the records describe: the newest record's own time (not later than ``now``)."""
    newest = max((r.published_at for r in reports.values()), default=0.0)
    return min(now, newest) if newest else now


def _reporter(reports: Reports) -> WorkerReport | None:
    """Whose record goodput is booked from: replica 0's, as the local backend reads rank 0's."""
    return reports.get(0) or (reports[min(reports)] if reports else None)


def goodput_view(job: LiveJobSet, reports: Reports, now: float) -> GoodputView:
    """Where the workload's time went, from its workers' records (see the module)."""
    record = job.record
    size = job.spec.num_slices if job.spec else 1
    terminal = job.terminal is not None or (record is not None and record.workload.phase.terminal)
    end = (record.workload.status_time or now) if terminal and record is not None else as_of(reports, now)
    seconds = dict(record.phase_seconds) if record is not None else {}
    if record is not None and not terminal:
        since = record.phase_since if record.phase_since is not None else end
        seconds[record.workload.phase.value] = seconds.get(record.workload.phase.value, 0.0) + max(0.0, end - since)
    ledger = Ledger()
    ledger.add(Category.QUEUED, size * seconds.get("QUEUED", 0.0))
    reporter = _reporter(reports)
    attempts = reporter.attempts if reporter is not None else []
    stepped = any(a.first_step is not None for a in attempts)
    created = record.workload.created_at if record is not None else job.created  # as the local backend: the workload's creation
    wall = max(0.0, end - created)
    if not stepped:  # nobody can tell what the running time was: unknown, not a badput
        ledger.add(Category.RECOVERY, max(0.0, min(size * wall - ledger.total, size * seconds.get("RESTARTING", 0.0))))
        unknown = max(0.0, size * wall - ledger.total)
    else:
        booked, unknown = 0.0, 0.0
        for index, attempt in enumerate(attempts):
            later = attempts[index + 1] if index + 1 < len(attempts) else None
            stop = (later.process_t or later.started) if later is not None else (attempt.stopped_at if attempt.stop else end)
            stretches, spent = [], []
            for i, segment in enumerate(attempt.segments):
                last = i + 1 == len(attempt.segments)
                until = max(segment.end, min(stop or end, end)) if last else attempt.segments[i + 1].start
                stretches.append(Stretch(segment.start, until, segment.slices or size))
                cursor = segment.start
                for name, amount in segment.seconds.items():
                    spent.append(Spent(Category(name), cursor, cursor + amount, segment.slices or None))
                    cursor += amount
            booked += sum(max(0.0, s.stop - s.start) * size for s in stretches)
            account_run(ledger, size, stretches, spent)
            if later is not None and later.restored is not None:
                ledger.waste(attempt.wasted_after(later.restored))
        # Time no attempt's records cover: before the first one started (its pods scheduled and
        # starting) is startup; between attempts, recovery.
        first_start = min((a.segments[0].start for a in attempts if a.segments), default=end)
        rest = max(0.0, size * wall - ledger.seconds[Category.QUEUED] - booked)
        before = max(0.0, first_start - created - seconds.get("QUEUED", 0.0)) * size
        ledger.add(Category.STARTUP, min(rest, before))
        ledger.add(Category.RECOVERY, max(0.0, rest - before))
    total = ledger.total + unknown
    view: dict[str, Any] = {
        "source": "workers" if stepped else "controller",
        "wall_s": round(wall, 3),
        "as_of": round(end, 3),
        "goodput": (round(ledger.seconds[Category.PRODUCTIVE] / total, 4) if total else 0.0) if stepped else None,
        "badput": {c.value: round(v / total, 4) if total else 0.0 for c, v in ledger.seconds.items() if c is not Category.PRODUCTIVE},
        "slice_seconds": {c.value: round(v, 3) for c, v in ledger.seconds.items()},
    }
    if not stepped:
        view["running_share"] = round(unknown / total, 4) if total else 0.0
        view["reason"] = NO_STEPS_REASON if attempts else NO_REPORT_REASON
    return view  # type: ignore[return-value]


def steps_and_reforms(reports: Reports) -> tuple[list[StepDone], list[tuple[float, int]]]:
    """The steps MTTR needs (each attempt's first, and the first after each re-formation, of
    every replica) and the re-formations, from the records."""
    steps: list[StepDone] = []
    reforms: list[tuple[float, int]] = []
    for report in reports.values():
        for attempt in report.attempts:
            if attempt.first_step is not None:
                steps.append(StepDone(attempt.first_step[0], attempt.attempt, attempt.first_step[1]))
            for reformed, t, began in attempt.reforms:
                reforms.append((reformed, attempt.attempt))
                if t is not None and began is not None:
                    steps.append(StepDone(t, attempt.attempt, began))
    return steps, reforms


def recoveries_of(failures: Iterable[tuple[float, int]], reports: Reports) -> list[Recovery]:
    steps, reforms = steps_and_reforms(reports)
    return recoveries(list(failures), steps, reforms)


def progress_view(failures: Iterable[tuple[float, int]], reports: Reports) -> dict[str, Any]:
    """``describe``'s ``progress`` on Kubernetes: recoveries and MTTR, restores, from the records."""
    found = recoveries_of(failures, reports)
    reporter = _reporter(reports)
    return {
        **as_view(found),
        "restores": [{"t": round(a.restored_at, 3), "step": a.restored, "source": a.restored_from or "", "attempt": a.attempt}
                     for a in (reporter.attempts if reporter else []) if a.restored is not None and a.restored_at is not None],
        "reported_at": {str(replica): round(r.published_at, 3) for replica, r in sorted(reports.items())},
    }


def first_step_after(reports: Reports, attempt: int, failed_at: float) -> float | None:
    """When the first productive step after a failure at ``failed_at`` under ``attempt - 1``
    (restarted into ``attempt``) was made, by any replica; None while none was recorded."""
    found = recoveries_of([(failed_at, attempt - 1)], reports)
    return found[0].recovered_at if found else None


def rank_progress(reports: Reports, attempt: int, active: Iterable[int] | None = None) -> list[tuple[int, RankProgress, WorkerReport]]:
    """Each active replica's reporting rank's progress in the current attempt, with its index and
    record (its stall is judged as of the time its worker last wrote, ``published_at``: a
    replica that stopped writing, its pod gone, never looks more stalled than it last said).
    ``active``: the replica indexes the workload runs (an elastic workload's parked ones are left
    out; None: all)."""
    wanted = None if active is None else set(active)
    found: list[tuple[int, RankProgress, WorkerReport]] = []
    for replica, report in sorted(reports.items()):
        current = report.current
        if current is None or current.attempt != attempt or (wanted is not None and replica not in wanted):
            continue
        p = report.progress
        found.append((replica, RankProgress(
            f"replica {replica}/host 0", p.steps, p.last_step, p.last_step_at, max(p.intervals, default=0.0),
            p.saving_since, p.longest_save_s, p.save_ended_at, p.leaving or current.stop is not None,
        ), report))
    return found
