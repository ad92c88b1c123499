"""What the CLI shows about a local cluster, as plain data (the JSON contract of DESIGN.md).

Built from the database rows without constructing pydantic models, so ``workload list``
stays fast.
"""

from __future__ import annotations

from typing import Any

from hotswap.api.priority import Priority
from hotswap.backends.views import iso


def workload_view(record: dict[str, Any]) -> dict[str, Any]:
    spec = record["spec"]
    return {
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
    }
