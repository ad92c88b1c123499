"""Every deadline the controller keeps is a wake-up time of its loop.

A round asks :meth:`Deadlines.due` whether a deadline has come (a pod's grace period over, a
Job or a replica stalled, an exit's hold, a gated pod's timer) and acts if it has; one that has
not come yet becomes a time to run the next round at, even if no watch event arrives before it
(:attr:`Deadlines.wake_at`). The check and its wake-up are one call, so that no check can wait
for the periodic resync because its deadline was left out of a separate list of wake times.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Deadlines:
    """One round's time (``now``) and the earliest deadline it found still to come."""

    now: float
    wake_at: float | None = None

    def due(self, at: float) -> bool:
        """Whether ``at`` has come; if not, the loop wakes then."""
        if self.now >= at:
            return True
        self.wake(at)
        return False

    def wake(self, at: float) -> None:
        """Run a round again by ``at``."""
        self.wake_at = at if self.wake_at is None else min(self.wake_at, at)
