"""What the CLI shows about a local cluster, as plain data (the JSON contract of DESIGN.md).

Built from the database rows without constructing pydantic models, so ``workload list``
stays fast.
"""

from __future__ import annotations

import json
from typing import Any

from hotswap.api.launch import Launch
from hotswap.api.priority import Priority
from hotswap.api.xpk_status import with_xpk_words
from hotswap.backends.local.gpu.backing import Backing
from hotswap.backends.local.timeline import NODE_ENTRY_KINDS
from hotswap.backends.views import GpuHealth, GpuView, WorkloadRow, iso
from hotswap.store.state import Store


def workload_view(record: dict[str, Any]) -> WorkloadRow:
    spec = record["spec"]
    return with_xpk_words({
        "name": spec["name"],
        "priority": Priority.parse(spec["priority"]).label,
        "status": record["phase"],
        "status_message": record["status_message"],
        "status_time": iso(record["status_time"]),
        "created_time": iso(record["created_at"]),
        "slices": list(record["slices"]),
        "num_slices": spec["num_slices"],
        "min_slices": spec["min_slices"],
        "device_type": spec["device_type"],
        "restarts": record["restarts"],
        "preemptions": record["preemptions"],
        "disruptions": record["disruptions"],
        "attempt": record["attempt"],
        "command": spec["command"],
    })


def node_reasons(store: Store) -> dict[str, str]:
    """Why each node is in its state: the reason of its latest fault or repair (empty once
    repaired; a GPU's fault names the GPU)."""
    reasons: dict[str, str] = {}
    for row in store.cluster_entries(NODE_ENTRY_KINDS):
        data = json.loads(row["data"]) if row["data"] else {}
        if "node" in data:
            reasons[data["node"]] = data.get("reason", "")
    return reasons


def gpu_views(backing: Backing | None, slice_name: str, host: int | None = None) -> list[GpuView]:
    """The GPUs behind a slice (or one of its hosts): index, UUID and model."""
    if backing is None:
        return []
    gpus = backing.slices.get(slice_name, ()) if host is None else backing.host_gpus(slice_name, host)
    return [{"index": g.index, "uuid": g.uuid, "name": g.name} for g in gpus]


def gpu_health(store: Store) -> GpuHealth | None:
    """The controller's latest word on GPU health (watching, or NVML unavailable)."""
    rows = store.cluster_entries(("gpu-health",))
    if not rows:
        return None
    latest = rows[-1]
    return {"time": iso(latest["t"]), "message": latest["message"]}


def run_view(launch: Launch) -> dict[str, Any]:
    """The run fields of a workload's JSON (``run_id``, ``resumed_from``); None for a workload
    created by a release without runs."""
    run = launch.run
    if run is None:
        return {"run_id": None, "resumed_from": None}
    view = {"run_id": run.id, "resumed_from": None if run.resumed_from is None else dict(run.resumed_from)}
    if run.not_resumed is not None:  # a fresh start that passed a predecessor's checkpoint over says why
        view["not_resumed"] = dict(run.not_resumed)
    return view
