"""What breaks a JAX process out of a call that no longer returns.

A collective whose peer hung (a node that vanished without closing its sockets) waits as long
as the collective library lets it, and ``jax.distributed.initialize`` waits for every member
of a generation that may never form. JAX can interrupt neither. This thread watches the
membership file: once the controller has published a newer generation and the main thread has
not reached a step boundary for ``stall_s`` (a second, if another rank has already left the
generation: the collective may be waiting on it), or is still initialising the old generation,
it moves the process on itself: the state goes from the last step known computed (or the last
host snapshot), and the process restarts into the new generation (the move counted from the
last step boundary: the step stuck since then is counted as no step). A SIGTERM while
initialising that outlasts ``stall_s`` ends the process with the checkpointed code (there is
no group to save with).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from hotswap.api.membership import Membership
from hotswap.train.membership import MembershipWatcher

log = logging.getLogger("hotswap.train")

POLL_S = 0.1
FORMING_GRACE_S = 1.0  # let the main thread notice first; rank 0 waits twice as long (it leaves last)
LEFT_GRACE_S = 1.0  # once another rank has left the generation, the main thread gets this long


class Watchdog:
    def __init__(
        self,
        membership_file: str,
        *,
        stall_s: float,
        generation: Callable[[], int],
        forming: Callable[[], int | None],
        is_rank_zero: Callable[[], bool],
        others_leaving: Callable[[], bool],
        terminated: Callable[[], bool],
        on_stall: Callable[[Membership, bool, float], None],
        on_terminated: Callable[[], None],
    ) -> None:
        self.watcher = MembershipWatcher(membership_file)  # its own: the main thread polls the file too
        self.stall_s = stall_s
        self.generation = generation
        self.forming = forming
        self.is_rank_zero = is_rank_zero
        self.others_leaving = others_leaving
        self.terminated = terminated
        self.on_stall = on_stall
        self.on_terminated = on_terminated
        self._boundary_at = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hotswap-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def beat(self) -> None:
        """The main thread is at a step boundary."""
        self._boundary_at = time.monotonic()

    def _run(self) -> None:
        newer_since: float | None = None
        terminated_since: float | None = None
        while not self._stop.wait(POLL_S):
            now = time.monotonic()
            forming = self.forming()
            if forming is not None and self.terminated():  # the others may form and save with us: wait a while
                terminated_since = terminated_since or now
                if now - terminated_since >= self.stall_s:
                    self.on_terminated()
                    return
            newest = self.watcher.poll()
            current = forming if forming is not None else self.generation()
            if newest is None or newest.generation <= current:
                newer_since = None
                continue
            newer_since = newer_since or now
            if forming is not None:
                grace = FORMING_GRACE_S * (2 if self.is_rank_zero() else 1)
                stalled = now - newer_since >= grace
            else:  # stuck for long, or while the others have left (a collective that waits on them)
                waited = now - max(newer_since, self._boundary_at)
                stalled = waited >= self.stall_s or (waited >= LEFT_GRACE_S and self.others_leaving())
            if stalled:
                log.warning(
                    "hotswap: generation %d is published and this process is stuck %s: restarting into it",
                    newest.generation, "forming its group" if forming is not None else "in a step",
                )
                # The process is stuck since its last boundary: the step it began there.
                self.on_stall(newest, forming is not None, self._boundary_at)
                return
