"""Small policy objects: how worker exits are judged, and which mechanisms a cluster uses."""

from __future__ import annotations

import dataclasses
import enum

from hotswap.api.spec import ExitCodes, WorkloadSpec


class ExitVerdict(enum.Enum):
    SUCCEEDED = "succeeded"
    RESTART = "restart"
    FAIL = "fail"


@dataclasses.dataclass(frozen=True, slots=True)
class FailurePolicy:
    """JobSet-style failure policy of one workload.

    A non-zero exit whose code is in ``restart_on`` restarts the workload, charged against
    ``max_restarts``; any other non-zero code fails it. Preemptions and node failures never reach
    this policy: the core handles them before looking at exit codes.
    """

    max_restarts: int
    restart_on: ExitCodes

    @classmethod
    def of(cls, spec: WorkloadSpec) -> FailurePolicy:
        return cls(spec.max_restarts, spec.restart_on_exit_codes)

    def judge(self, code: int, restarts_so_far: int) -> tuple[ExitVerdict, str]:
        """The verdict on one worker exit, with a reason a user can read."""
        if code == 0:
            return ExitVerdict.SUCCEEDED, "exited 0"
        if code not in self.restart_on:
            return ExitVerdict.FAIL, (
                f"exit code {code} is not a restart code ({self.restart_on or 'none'}): user error"
            )
        if restarts_so_far >= self.max_restarts:
            return ExitVerdict.FAIL, (
                f"exit code {code} would restart it, but max restarts ({self.max_restarts}) is used up"
            )
        return ExitVerdict.RESTART, (
            f"exit code {code} is a restart code; restart {restarts_so_far + 1} of {self.max_restarts}"
        )

    def judge_hang(self, restarts_so_far: int) -> tuple[ExitVerdict, str]:
        """The verdict on a hang: like a crash with a restart code (a hang has no exit code to
        judge, and a stuck collective is the infrastructure's more often than the job's)."""
        if restarts_so_far >= self.max_restarts:
            return ExitVerdict.FAIL, f"max restarts ({self.max_restarts}) is used up"
        return ExitVerdict.RESTART, f"restart {restarts_so_far + 1} of {self.max_restarts}"


class VictimOrder(str, enum.Enum):
    """Which lower-priority holder is evicted first within one priority level, when shrinking
    elastic work is not enough (priority always comes first).

    ``least-lost-work`` is hotswap's rule (:func:`hotswap.core.ordering.candidates_ordering`):
    the holder that loses the least progress since its last checkpoint, as Kueue's issue 477
    ("Use information about last checkpoint on preemption") proposes. ``newest-first`` is what
    Kueue does today: within a priority level, the most recently admitted first, whatever it
    would lose (kubernetes-sigs/kueue pkg/scheduler/preemption/common, ``CandidatesOrdering``:
    lower priority first, then the later ``quotaReservationTime`` first). Only the simulator's
    comparison (``hotswap simulate --compare-victims``) selects it.
    """

    LEAST_LOST_WORK = "least-lost-work"
    NEWEST_FIRST = "newest-first"


@dataclasses.dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Which recovery mechanisms the core uses (the simulator compares them).

    ``hotswap``: a workload that loses a slice is placed at once on free healthy slices or on
    slices taken from lower-priority work; without it, it waits holding its slices until the
    broken ones are repaired. ``elastic``: workloads with ``min_slices`` scale down and up
    instead of restarting. ``victims``: which holder of a priority level is evicted first
    (:class:`VictimOrder`).
    """

    hotswap: bool = True
    elastic: bool = True
    victims: VictimOrder = VictimOrder.LEAST_LOST_WORK


DEFAULT_CONFIG = SchedulerConfig()
