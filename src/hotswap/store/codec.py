"""The core's records as JSON and back (what the database stores).

A workload's record holds its replica map (``replicas``: the slice of each replica index, None
where parked); a record of an earlier release, without one, reads back with the map its slices
imply (replica i on slices[i]), as do the maps of every (re)start.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hotswap.api.phases import WorkloadPhase
from hotswap.core.placement import recorded_map
from hotswap.core.workload import Workload

if TYPE_CHECKING:  # pydantic is loaded only where a spec is decoded
    from hotswap.api.spec import WorkloadSpec


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    return {"spec": workload.spec.model_dump(mode="json"), **workload_fields(workload)}


def workload_fields(workload: Workload) -> dict[str, Any]:
    """A workload's record without its spec (which the Kubernetes backend keeps apart)."""
    return {
        "seq": workload.seq,
        "created_at": workload.created_at,
        "phase": workload.phase.value,
        "slices": list(workload.slices),
        "replicas": list(workload.replica_map),
        "attempt": workload.attempt,
        "stopping": sorted(workload.stopping),
        "membership": workload.membership,
        "restarts": workload.restarts,
        "disruptions": workload.disruptions,
        "preemptions": workload.preemptions,
        "running_since": workload.running_since,
        "last_checkpoint_at": workload.last_checkpoint_at,
        "last_checkpoint_step": workload.last_checkpoint_step,
        "exited_ok": sorted([s, h] for s, h in workload.exited_ok),
        "status_message": workload.status_message,
        "status_time": workload.status_time,
    }


def workload_to_json(workload: Workload) -> str:
    return json.dumps(workload_to_dict(workload), sort_keys=True)


def workload_from_json(text: str) -> Workload:
    # Imported here: pydantic costs ~60 ms at start-up, and the CLI's reads never decode a spec.
    from hotswap.api.spec import WorkloadSpec

    data = json.loads(text)
    return workload_from_fields(data, WorkloadSpec.model_validate(data["spec"]))


def workload_from_fields(data: Mapping[str, Any], spec: WorkloadSpec) -> Workload:
    """The workload of a record whose spec is read already (``data["spec"]`` is not looked at).
    KeyError for a missing field; the fields' types are :func:`check_fields`' business."""
    slices = tuple(data["slices"])
    return Workload(
        spec=spec,
        seq=data["seq"],
        created_at=data["created_at"],
        phase=WorkloadPhase(data["phase"]),
        slices=slices,
        replicas=recorded_map(data.get("replicas"), slices, spec.num_slices),
        attempt=data["attempt"],
        stopping=frozenset(data["stopping"]),
        membership=data["membership"],
        restarts=data["restarts"],
        disruptions=data["disruptions"],
        preemptions=data["preemptions"],
        running_since=data["running_since"],
        last_checkpoint_at=data["last_checkpoint_at"],
        last_checkpoint_step=data["last_checkpoint_step"],
        exited_ok=frozenset((s, h) for s, h in data["exited_ok"]),
        status_message=data["status_message"],
        status_time=data["status_time"],
    )


def check_fields(data: Mapping[str, Any]) -> None:
    """TypeError unless each field of a record that anyone may have edited (the Kubernetes
    state annotation) holds the JSON type its field needs: a count that is text, a time that
    is a list, would otherwise reach the core and break every round. (``replicas`` is read
    leniently: :func:`~hotswap.core.placement.recorded_map`.)"""
    wrong = [key for key, accepts in _FIELD_TYPES.items() if key in data and not accepts(data[key])]
    if wrong:
        raise TypeError(f"fields of the wrong type: {', '.join(wrong)}")


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def _time(value: object) -> bool:
    return type(value) in (int, float)


def _optional(accepts: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or accepts(value)


def _list_of(accepts: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: type(value) is list and all(accepts(item) for item in value)


def _worker(value: object) -> bool:
    """An ``exited_ok`` entry: [slice, host]."""
    return type(value) is list and len(value) == 2 and type(value[0]) is str and _count(value[1])


_FIELD_TYPES: dict[str, Callable[[object], bool]] = {
    "seq": _count,
    "created_at": _time,
    "phase": lambda value: type(value) is str,
    "slices": _list_of(lambda value: type(value) is str),
    "attempt": _count,
    "stopping": _list_of(_count),
    "membership": _count,
    "restarts": _count,
    "disruptions": _count,
    "preemptions": _count,
    "running_since": _optional(_time),
    "last_checkpoint_at": _optional(_time),
    "last_checkpoint_step": _optional(lambda value: type(value) is int),
    "exited_ok": _list_of(_worker),
    "status_message": lambda value: type(value) is str,
    "status_time": _time,
}


def json_object(text: str) -> dict[str, Any]:
    """A JSON object stored in a row (ValueError for anything else)."""
    try:
        value = json.loads(text)
    except (TypeError, RecursionError) as error:
        raise ValueError(f"not JSON text ({error.__class__.__name__})") from None
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object: {str(text)[:40]!r}")
    return value
