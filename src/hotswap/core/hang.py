"""Hang detection: has a running workload stopped completing steps? Pure: ``now`` is passed in.

A backend watches each rank's progress (locally: the SDK's ``step``, ``checkpoint_begin``,
``checkpoint_save`` and ``stop`` events) and asks :func:`judge`; a hang becomes a
:class:`~hotswap.core.events.WorkloadHung` event, and the failure policy restarts the workload
(charged, like a crash) or fails it.

The step timeout is the user's when they set one (``workload create --hang-timeout S``: S,
whatever the steps take). Otherwise it comes from the workload's own step times, as NVIDIA's
resiliency extension derives its heartbeat timeouts when asked to: ``safety_factor`` times the
longest recent interval between two steps, never below ``floor_s``. The floor is generous on
purpose: a real loop pauses between steps (an evaluation pass, a data loader that stalls, the
first steps after a restore, a host loaded far beyond its cores), and a false hang restarts a
healthy job, costing more than a real hang noticed a minute late. It matches torchft's
default timeout for collectives and quorums (60 s); the resiliency extension's own defaults
are far longer (45 min between heartbeats, an hour for the first) until it has calculated
timeouts from what it saw.

What is never a hang:

- a rank with no step since the watch began: the first step of an attempt (imports, compiling,
  restoring) or of an elastic generation (re-forming the group, sending state) may take long;
- a rank that is leaving: it recorded its stop (the loop is over; what the script does next,
  and the interpreter's exit, may take as long as they take) or is writing its last save
  (``final`` or ``termination``: bounded by the grace period, not by step times);
- a save the SDK announced (``checkpoint_begin``) and has not finished: it gets
  ``safety_factor`` times the longest save seen so far, at least the step timeout, and
  ``first_save_allowance_s`` when none was seen yet;
- time the watcher did not see: stalls count from ``watched_since`` at the earliest, so a
  restarted (or itself stalled) controller does not blame the job for its own absence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

SAFETY_FACTOR = 5.0  # the resiliency extension's default safety factor
FLOOR_S = 60.0  # without --hang-timeout, no hang is declared sooner than this after the last step
FIRST_SAVE_ALLOWANCE_S = 600.0  # a save with no earlier save to compare it to
WINDOW_STEPS = 100  # the recent intervals the longest one is taken over


@dataclasses.dataclass(frozen=True, slots=True)
class HangLimits:
    """How long a workload may go without a step: the user's limit (None: derived from the
    step times; 0: never judged) and the policy's constants."""

    limit_s: float | None = None
    floor_s: float = FLOOR_S
    safety_factor: float = SAFETY_FACTOR
    first_save_allowance_s: float = FIRST_SAVE_ALLOWANCE_S

    @property
    def enabled(self) -> bool:
        return self.limit_s != 0

    @property
    def derived(self) -> bool:
        return self.limit_s is None

    def step_timeout(self, longest_interval_s: float) -> float:
        if self.limit_s is not None:
            return self.limit_s
        return max(self.floor_s, self.safety_factor * longest_interval_s)

    def save_allowance(self, step_timeout_s: float, longest_save_s: float | None) -> float:
        if longest_save_s is None:
            return max(step_timeout_s, self.first_save_allowance_s)
        return max(step_timeout_s, self.safety_factor * longest_save_s)


@dataclasses.dataclass(frozen=True, slots=True)
class RankProgress:
    """One rank's progress since the watch began (see the module for what each field means to
    the judgement)."""

    label: str  # where the rank runs, for messages ("<slice>/<host>", ".<local rank>" if several)
    steps: int = 0  # steps completed since the watch began
    last_step: int | None = None  # the number of the latest
    last_step_at: float | None = None  # when it completed
    longest_interval_s: float = 0.0  # between completions, over the recent window
    saving_since: float | None = None  # an announced save has not finished
    longest_save_s: float | None = None  # the longest time a save held the loop so far
    save_ended_at: float | None = None  # the last save's end: the next step is due from then
    leaving: bool = False  # recorded its stop, or writes its last save: never judged


@dataclasses.dataclass(frozen=True, slots=True)
class Hang:
    label: str
    last_step: int | None
    stalled_s: float
    timeout_s: float
    longest_interval_s: float
    saving: bool
    derived: bool = True  # the timeout came from the step times (else from --hang-timeout)

    @property
    def reason(self) -> str:
        what = "a checkpoint save announced" if self.saving else f"step {self.last_step} completed"
        source = (
            f"from a longest recent step interval of {self.longest_interval_s:.2f}s" if self.derived
            else f"--hang-timeout; longest recent step interval {self.longest_interval_s:.2f}s"
        )
        return f"rank {self.label}: nothing for {self.stalled_s:.1f}s since {what} (timeout {self.timeout_s:.1f}s, {source})"


@dataclasses.dataclass(frozen=True, slots=True)
class _Deadline:
    since: float  # the last progress the watcher saw
    allowed_s: float
    saving: bool

    @property
    def at(self) -> float:
        return self.since + self.allowed_s


def _deadline(rank: RankProgress, watched_since: float, limits: HangLimits) -> _Deadline | None:
    if rank.steps == 0 or rank.last_step_at is None:
        return None  # no history yet
    if rank.leaving:
        return None
    timeout = limits.step_timeout(rank.longest_interval_s)
    if rank.saving_since is not None and rank.saving_since >= rank.last_step_at:
        allowed = limits.save_allowance(timeout, rank.longest_save_s)
        return _Deadline(max(rank.saving_since, watched_since), allowed, saving=True)
    since = max(rank.last_step_at, rank.save_ended_at or rank.last_step_at, watched_since)
    return _Deadline(since, timeout, saving=False)


def judge(ranks: Iterable[RankProgress], watched_since: float, now: float, limits: HangLimits) -> Hang | None:
    """The most overdue rank of a running workload, if any rank is past its deadline."""
    if not limits.enabled:
        return None
    worst: tuple[float, Hang] | None = None
    for rank in ranks:
        deadline = _deadline(rank, watched_since, limits)
        if deadline is None or now <= deadline.at:
            continue
        overdue = now - deadline.at
        if worst is None or overdue > worst[0]:
            hang = Hang(
                rank.label, rank.last_step, now - deadline.since, deadline.allowed_s, rank.longest_interval_s,
                deadline.saving, limits.derived,
            )
            worst = (overdue, hang)
    return worst[1] if worst else None


def next_deadline(ranks: Iterable[RankProgress], watched_since: float, limits: HangLimits) -> float | None:
    """When :func:`judge` could first find a hang among these ranks if nothing changes (the
    watcher sleeps until then)."""
    if not limits.enabled:
        return None
    deadlines = [d.at for d in (_deadline(rank, watched_since, limits) for rank in ranks) if d is not None]
    return min(deadlines) if deadlines else None
