"""Each replica's record Lease keeps asking its writer for the heartbeat interval of the
cluster as it is now (:func:`hotswap.api.worker_report.heartbeat_interval` of its slices):
``workload create`` set it for the cluster it saw; node pools added later would otherwise let
all heartbeats together exceed :data:`~hotswap.api.worker_report.HEARTBEATS_PER_S`.

The controller merge-patches the one annotation of a Lease whose interval differs (one patch per
Lease; nothing in the steady state), at most :data:`PATCHES_PER_S` a second (a grown cluster's
thousands of Leases are spread over rounds it wakes up for, not one burst); a refused patch is
retried the next round, as the Lease still differs. The patch leaves the record annotation alone
and changes the Lease's resourceVersion, so the worker's next write (an update of what it last
read) is refused with a conflict, it reads the Lease again and keeps the new interval from then
on; until that write it keeps the old one, and its record says so: the controller judges every
silence by the interval the record names (:mod:`.silence`), so the switch makes no false hang.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotswap.api.errors import HotswapError, NotFoundError
from hotswap.api.worker_report import INTERVAL_ANNOTATION, REPORT_ANNOTATION, heartbeat_interval, interval_of
from hotswap.backends.kubernetes.client import ForbiddenError, UnreachableError

FORBIDDEN_PAUSE_S = 300.0  # a Role of an earlier release (no `patch` on Leases): said once, tried again this much later
PATCHES_PER_S = 50.0  # the steady rate of these patches, and their burst (one second's worth): 2,000 Leases in 40 s


class ReportIntervals:
    """Patches the report Leases whose interval is not the cluster's, within the rate."""

    def __init__(self, patch_lease: Callable[[str, dict[str, Any]], Any], log: Callable[[str], None]) -> None:
        self.patch_lease = patch_lease
        self.interval_of_cluster: Callable[[int], float] = heartbeat_interval  # (tests: a small world standing for a large cluster)
        self.log = log
        self.tokens = PATCHES_PER_S
        self.filled_at: float | None = None
        self.forbidden_until: float | None = None
        self.wake_at: float | None = None  # Leases are left for a later round: run one when a second's worth may go

    def keep(self, leases: list[dict[str, Any]], slices: int, now: float) -> int:
        """Patch the Leases (as listed this round) to the interval of a cluster of ``slices``
        slices, as many as the rate allows; returns how many were patched."""
        wanted = self.interval_of_cluster(slices)
        stale = [lease for lease in leases if _differs(lease, wanted)]
        self._refill(now)
        if self.forbidden_until is not None and now < self.forbidden_until:
            stale = []
        patched = 0
        for lease in stale:
            if self.tokens < 1.0:
                break
            self.tokens -= 1.0
            name = lease["metadata"]["name"]
            try:
                self.patch_lease(name, {"metadata": {"annotations": {INTERVAL_ANNOTATION: f"{wanted:g}"}}})
            except UnreachableError:
                raise  # the round fails, retried with backoff
            except NotFoundError:
                continue  # its workload was deleted meanwhile
            except ForbiddenError as error:
                if self.forbidden_until is None:
                    self.log(f"warning: {error}; the records' heartbeat interval stays as created "
                             "(apply `hotswap controller manifests` again)")
                self.forbidden_until = now + FORBIDDEN_PAUSE_S
                break
            except HotswapError as error:  # still differs next round: patched again then
                self.log(f"warning: {error}; its heartbeat interval is set again next round")
                continue
            patched += 1
            self.forbidden_until = None
        self.wake_at = now + (PATCHES_PER_S - self.tokens) / PATCHES_PER_S if len(stale) > patched and self.tokens < 1.0 else None
        if patched:
            self.log(f"heartbeat interval {wanted:g}s ({slices} slices): {patched} record Lease(s) updated"
                     + (f", {len(stale) - patched} left for the next rounds" if len(stale) > patched else ""))
        return patched

    def _refill(self, now: float) -> None:
        if self.filled_at is not None:
            self.tokens = min(PATCHES_PER_S, self.tokens + max(0.0, now - self.filled_at) * PATCHES_PER_S)
        self.filled_at = now


def _differs(lease: dict[str, Any], wanted: float) -> bool:
    """A live record Lease asking for another interval than ``wanted``."""
    meta = lease.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if REPORT_ANNOTATION not in annotations or meta.get("deletionTimestamp"):
        return False
    return interval_of(annotations) != wanted
