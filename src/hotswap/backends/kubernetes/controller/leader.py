"""Leader election for the Kubernetes controller: only the holder of the ``hotswap-controller``
Lease acts (the Lease's rules are :mod:`~hotswap.backends.kubernetes.lease`'s; this keeps one
controller's view of them and writes the Lease)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from hotswap.api.errors import ConflictError, HotswapError
from hotswap.api.times import iso_utc
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.client import KubeClient
from hotswap.backends.kubernetes.lease import (
    LEASE_DURATION_S,
    RENEW_DEADLINE_S,
    Observed,
    lease_body,
    next_step,
    observe,
    read_lease,
    released,
)


def log_line(message: str) -> None:
    print(f"{iso_utc(time.time())} {message}", file=sys.stderr, flush=True)


class LeaderElector:
    """Takes and keeps the controller's Lease; :meth:`may_act` says whether we may write."""

    def __init__(
        self,
        client: KubeClient,
        identity: str,
        clock: Callable[[], float] = time.time,
        local_clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] = log_line,
    ) -> None:
        self.client = client
        self.identity = identity
        self.clock = clock  # stamps the Lease record (wall time, for people)
        self.local_clock = local_clock  # judges expiry and the renew deadline (never another machine's)
        self.log = log
        self.is_leader = False
        self.observed: Observed | None = None
        self.renewed_at: float | None = None  # local time of our last successful write

    def may_act(self) -> bool:
        """Leader, and renewed within the renew deadline."""
        return self.is_leader and self.renewed_at is not None and self.local_clock() < self.renewed_at + RENEW_DEADLINE_S

    def tick(self) -> bool:
        """One ``tryAcquireOrRenew``; returns :meth:`may_act`."""
        was = self.is_leader
        local = self.local_clock()
        try:
            self._try(local)
        except HotswapError as error:
            if self.is_leader and not self.may_act():
                self.is_leader = False
            if was:
                self.log(f"warning: lease: could not renew: {error}")
        if self.is_leader and not self.may_act():
            self.is_leader = False
        if self.is_leader != was:
            holder = self.identity if self.is_leader else ((self.observed.key[0] if self.observed else None) or "nobody")
            self.log(f"leader: {holder}" + (" (this controller)" if self.is_leader else "; this controller waits"))
        return self.may_act()

    def _try(self, local: float) -> None:
        current_obj = self.client.get_lease(labels.CONTROLLER_NAME)
        current = read_lease(current_obj) if current_obj is not None else None
        if current is not None:
            self.observed = observe(current, self.observed, local)
        step = next_step(current, self.observed, self.identity, self.clock(), local, LEASE_DURATION_S)
        if step.action == "wait":
            self.is_leader = False
            return
        assert step.record is not None
        body = lease_body(labels.CONTROLLER_NAME, self.client.namespace, step.record)
        try:
            written = (self.client.create_lease if step.action == "create" else
                       lambda b: self.client.replace_lease(labels.CONTROLLER_NAME, b))(body)
        except ConflictError:
            self.is_leader = False  # another controller wrote the Lease first: it leads
            return
        self.is_leader = True
        self.renewed_at = local
        self.observed = Observed(read_lease(written).key(), local)

    def release(self) -> None:
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            current_obj = self.client.get_lease(labels.CONTROLLER_NAME)
            record = released(read_lease(current_obj), self.identity) if current_obj is not None else None
            if record is not None:
                self.client.replace_lease(labels.CONTROLLER_NAME, lease_body(labels.CONTROLLER_NAME, self.client.namespace, record))
        except HotswapError:
            pass  # it expires on its own
