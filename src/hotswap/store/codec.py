"""The core's records as JSON and back (what the database stores).

A workload's record holds its replica map (``replicas``: the slice of each replica index, None
where parked); a record of an earlier release, without one, reads back with the map its slices
imply (replica i on slices[i]), as do the maps of every (re)start.
"""

from __future__ import annotations

import json
from typing import Any

from hotswap.api.phases import WorkloadPhase
from hotswap.core.placement import recorded_map
from hotswap.core.workload import Workload


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    return {
        "spec": workload.spec.model_dump(mode="json"),
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
    spec = WorkloadSpec.model_validate(data["spec"])
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


def json_object(text: str) -> dict[str, Any]:
    """A JSON object stored in a row (ValueError for anything else)."""
    try:
        value = json.loads(text)
    except (TypeError, RecursionError) as error:
        raise ValueError(f"not JSON text ({error.__class__.__name__})") from None
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object: {str(text)[:40]!r}")
    return value
