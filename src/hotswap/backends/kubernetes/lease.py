"""Leader election on a ``coordination.k8s.io/v1`` Lease, as pure decisions (client-go's rules).

One controller per cluster acts; others wait. The holder renews the Lease every few seconds; a
Lease not renewed within its duration is free to take. Every write carries the resourceVersion
that was read, so of two controllers racing for the same Lease the API server lets exactly one
win (the other gets 409 Conflict and stays a follower).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hotswap.api.times import iso_utc, parse_iso_utc


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    holder: str | None
    acquired: float | None
    renewed: float | None
    duration_s: int
    transitions: int = 0
    resource_version: str | None = None

    def expired(self, now: float) -> bool:
        return self.renewed is None or now > self.renewed + self.duration_s


def micro_time(seconds: float) -> str:
    """Kubernetes MicroTime: RFC 3339 with microseconds."""
    return iso_utc(seconds, 6)


def _time(text: str | None) -> float | None:
    return parse_iso_utc(text) if text else None


def read_lease(obj: dict[str, Any]) -> LeaseRecord:
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    return LeaseRecord(
        holder=spec.get("holderIdentity") or None,
        acquired=_time(spec.get("acquireTime")),
        renewed=_time(spec.get("renewTime")),
        duration_s=int(spec.get("leaseDurationSeconds") or 15),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=meta.get("resourceVersion"),
    )


def lease_body(name: str, namespace: str, record: LeaseRecord) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if record.resource_version is not None:
        metadata["resourceVersion"] = record.resource_version
    spec: dict[str, Any] = {"holderIdentity": record.holder, "leaseDurationSeconds": record.duration_s, "leaseTransitions": record.transitions}
    if record.acquired is not None:
        spec["acquireTime"] = micro_time(record.acquired)
    if record.renewed is not None:
        spec["renewTime"] = micro_time(record.renewed)
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}


@dataclasses.dataclass(frozen=True)
class LeaseStep:
    """What to do about the Lease now: ``create`` it, ``update`` it (renew or take over), or
    ``wait`` (someone else holds it)."""

    action: str
    record: LeaseRecord | None


def next_step(current: LeaseRecord | None, me: str, now: float, duration_s: int) -> LeaseStep:
    if current is None:
        return LeaseStep("create", LeaseRecord(me, now, now, duration_s))
    if current.holder == me:
        return LeaseStep("update", dataclasses.replace(current, renewed=now, duration_s=duration_s))
    if current.holder is None or current.expired(now):
        return LeaseStep(
            "update",
            dataclasses.replace(current, holder=me, acquired=now, renewed=now, duration_s=duration_s, transitions=current.transitions + 1),
        )
    return LeaseStep("wait", None)


def released(current: LeaseRecord, me: str) -> LeaseRecord | None:
    """The record that lets go of the Lease on a clean shutdown (so a successor need not wait
    for it to expire), or None when it is not ours."""
    if current.holder != me:
        return None
    return dataclasses.replace(current, holder=None, renewed=None, acquired=None)
