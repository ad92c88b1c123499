"""The ``hotswap.dev/state`` annotation: what only the core knows about a workload (queue order,
attempts, preemptions, the slice each replica was placed on), kept on its JobSet so that the
controller stays stateless. The controller writes it; every reconcile, and a new leader, reads
it back.

The record is the store's JSON of the core's :class:`~hotswap.core.workload.Workload` without its
spec (the spec has its own annotation), its replica map (``replicas``, the core's assignment)
written with one entry per replica index of the JobSet, plus keys of the Kubernetes backend:
the seconds spent in each phase (for ``describe``'s goodput), and the workers whose pods the
controller has released for the current attempt, by child Job and completion index (``{"<job
uid>": "0-3"}``): a gated pod for one of those replaces a worker that is gone, even if its pod
vanished while no controller was looking; why the current attempt started (``start_cause``,
given to its pods when they are released); and the child Jobs of an earlier attempt that a
restart, preemption or scale-down retires (``retiring``: ``{"<job uid>": "<job name>"}``),
recorded in the same write as the decision and deleted after it, by UID (:mod:`.child_jobs`).
"""

from __future__ import annotations

import json
from typing import Any

import pydantic

from hotswap.api.spec import WorkloadSpec
from hotswap.core.workload import Workload
from hotswap.store.codec import workload_from_json, workload_to_dict

_EXTRA_STATE = ("phase_seconds", "phase_since", "released_jobs", "start_cause", "retiring")


Released = dict[str, frozenset[int]]  # child Job uid -> completion indexes released
Retiring = dict[str, str]  # child Job uid -> its name: Jobs of an earlier attempt, to delete


def replica_slots(workload: Workload) -> list[str | None]:
    """The core's replica map with one entry per replica index of the JobSet: the slice its
    pods are released onto, None for a parked one."""
    replicas = list(workload.replica_map)
    return replicas + [None] * (workload.spec.num_slices - len(replicas))


def state_of(
    workload: Workload, previous: dict[str, Any] | None, now: float,
    released: Released | None = None, start_cause: str | None = None, retiring: Retiring | None = None,
) -> dict[str, Any]:
    """What the state annotation holds: the core's record without the spec (its replica map as
    :func:`replica_slots`), and the seconds spent in each phase so far (closed at every phase
    change, so the annotation is rewritten only when something happens)."""
    record = workload_to_dict(workload)
    del record["spec"]
    record["replicas"] = replica_slots(workload)
    if start_cause:
        record["start_cause"] = start_cause  # why the current attempt started (HOTSWAP_START_CAUSE)
    if released:
        record["released_jobs"] = {uid: _ranges(sorted(hosts)) for uid, hosts in sorted(released.items()) if hosts}
    if retiring:
        record["retiring"] = dict(sorted(retiring.items()))
    previous = previous or {}
    ledger = previous.get("phase_seconds")
    ledger = {k: float(v) for k, v in ledger.items() if isinstance(v, (int, float))} if isinstance(ledger, dict) else {}
    since = previous.get("phase_since")
    since = float(since) if isinstance(since, (int, float)) else now
    old_phase = previous.get("phase")
    if old_phase is not None and old_phase != record["phase"]:
        ledger[old_phase] = ledger.get(old_phase, 0.0) + max(0.0, now - since)
        since = now
    record["phase_seconds"] = ledger
    record["phase_since"] = since
    return record


def workload_from_state(spec: WorkloadSpec, state: dict[str, Any]) -> Workload | None:
    """The core's workload from its spec and state record, or None when the record is not one
    (edited by hand, or written by another version)."""
    record = {key: value for key, value in state.items() if key not in _EXTRA_STATE}
    record["spec"] = spec.model_dump(mode="json")
    try:
        return workload_from_json(json.dumps(record))
    except (KeyError, TypeError, ValueError, pydantic.ValidationError):
        return None


def encode_state(state: dict[str, Any]) -> str:
    """The annotation's text (keys sorted: the same record is always the same text)."""
    return json.dumps(state, sort_keys=True)


def decode_state(text: str) -> dict[str, Any] | None:
    """The annotation's record, or None when it is not a JSON object (anyone can edit an
    annotation: ``[]``, ``"x"`` or ``null`` must read as "no record", never crash a reconcile)."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def released_of(state: dict[str, Any] | None) -> Released:
    """The workers the record says were released: child Job uid -> completion indexes."""
    jobs = (state or {}).get("released_jobs")
    if not isinstance(jobs, dict):
        return {}
    return {uid: _indexes(text) for uid, text in jobs.items() if isinstance(uid, str) and isinstance(text, str)}


def retiring_of(state: dict[str, Any] | None) -> Retiring:
    """The Jobs the record says belong to an earlier attempt: uid -> name."""
    jobs = (state or {}).get("retiring")
    if not isinstance(jobs, dict):
        return {}
    return {uid: name for uid, name in jobs.items() if isinstance(uid, str) and isinstance(name, str)}


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
