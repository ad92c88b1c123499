"""Leader election on a ``coordination.k8s.io/v1`` Lease, as pure decisions (client-go's
``tools/leaderelection``, ``tryAcquireOrRenew`` and ``renew``).

One controller per cluster acts; others wait. Two rules make a second leader impossible:

- **Expiry is judged on the follower's own clock.** A follower remembers when it last saw the
  record change (``observed_at``, its monotonic clock) and takes the Lease over only when it has
  not changed for the lease duration. The holder's ``renewTime`` is never compared with the
  follower's clock: clocks of two machines differ, and a skewed one would take over a Lease that
  is being renewed.
- **A leader stops acting at its renew deadline.** The holder renews every retry period; if it
  has not managed to renew for ``RENEW_DEADLINE_S`` (shorter than the lease duration) it must
  consider itself a follower, even in the middle of a long reconcile, before anyone else may
  take over.

Every write carries the resourceVersion that was read, so of two controllers racing for the
same Lease the API server lets exactly one win (the other gets 409 Conflict).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hotswap.api.times import iso_utc, parse_iso_utc

LEASE_DURATION_S = 15  # client-go's defaults (LeaseDuration / RenewDeadline / RetryPeriod)
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 2.0


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    holder: str | None
    acquired: float | None
    renewed: float | None
    duration_s: int
    transitions: int = 0
    resource_version: str | None = None

    def key(self) -> tuple[Any, ...]:
        """The record as client-go compares it to notice a change (not the resourceVersion)."""
        return (self.holder, self.acquired, self.renewed, self.duration_s, self.transitions)


@dataclasses.dataclass(frozen=True)
class Observed:
    """The record a controller last saw change, and when (its own monotonic clock)."""

    key: tuple[Any, ...]
    at: float


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
        duration_s=int(spec.get("leaseDurationSeconds") or LEASE_DURATION_S),
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


def observe(current: LeaseRecord, previous: Observed | None, local_now: float) -> Observed:
    """What this controller has seen of the record: unchanged since ``previous``, or new now."""
    if previous is not None and previous.key == current.key():
        return previous
    return Observed(current.key(), local_now)


def next_step(
    current: LeaseRecord | None, observed: Observed | None, me: str, wall_now: float, local_now: float, duration_s: int
) -> LeaseStep:
    """client-go's ``tryAcquireOrRenew``: ``observed`` must come from :func:`observe` on this
    same ``current``; ``wall_now`` stamps the record, ``local_now`` judges expiry."""
    if current is None:
        return LeaseStep("create", LeaseRecord(me, wall_now, wall_now, duration_s))
    if current.holder == me:
        return LeaseStep("update", dataclasses.replace(current, renewed=wall_now, duration_s=duration_s))
    held = current.holder is not None
    if held and (observed is None or local_now < observed.at + current.duration_s):
        return LeaseStep("wait", None)
    return LeaseStep(
        "update",
        dataclasses.replace(current, holder=me, acquired=wall_now, renewed=wall_now, duration_s=duration_s, transitions=current.transitions + 1),
    )


def released(current: LeaseRecord, me: str) -> LeaseRecord | None:
    """The record that lets go of the Lease on a clean shutdown (so a successor need not wait
    for it to expire), or None when it is not ours."""
    if current.holder != me:
        return None
    return dataclasses.replace(current, holder=None, renewed=None, acquired=None)
