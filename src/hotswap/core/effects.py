"""What an action does to a workload's workers, in one place: :func:`effect_of`.

The local backend, the Kubernetes backend and the simulator only enact an
:class:`ActionEffect` (stop these workers, start those, publish a membership generation,
record this message); none of them decides again which workers an action stops, why its
workers start, or how it reads in the timeline. Pure: one action in, one small object out.
"""

from __future__ import annotations

import dataclasses

from hotswap.api.runs import CAUSE_ELASTIC
from hotswap.core import actions as act

# Which of the workload's workers stop (``ActionEffect.stop``).
STOP_NONE = "none"
STOP_ALL = "all"  # every worker of the workload
STOP_OLDER = "older"  # those of attempts before ``ActionEffect.attempt``
STOP_REMOVED = "removed"  # those on ``ActionEffect.removed``

# How the replica list (replica i on slice i) changes (``ActionEffect.placement``).
KEEP = "keep"  # unchanged
PLACE = "place"  # replica i now runs on ``replicas[i]``
PARK = "park"  # no replica runs anywhere
SHRINK = "shrink"  # the replicas on ``removed`` are parked; the others keep their index
GROW = "grow"  # ``start`` (the added slices) fill the parked replicas, in order


@dataclasses.dataclass(frozen=True, slots=True)
class ActionEffect:
    """What ``action`` does to its workload's workers (see :mod:`hotswap.core.actions`)."""

    action: act.Action
    stop: str = STOP_NONE  # which workers stop (STOP_*); gracefully: SIGTERM, SIGKILL after the grace period
    graceful: bool = True  # False: the stop follows a loss (work since the last checkpoint is lost)
    removed: tuple[str, ...] = ()  # the slices whose workers stop (STOP_REMOVED)
    start: tuple[str, ...] = ()  # slices whose workers start now...
    replicas: tuple[str, ...] = ()  # ...as replicas of this list (replica i on replicas[i])
    attempt: int | None = None  # ...in this attempt (None: the workload's current one)
    generation: tuple[str, ...] | None = None  # a new membership generation of these active slices
    placement: str = KEEP  # how the replica list changes
    held: bool = False  # a new attempt whose workers wait for a later StartWorkers
    cause: str | None = None  # why its workers start (START_CAUSES); None: not this action's to say
    replaced: bool = False  # every worker of the workload (on Kubernetes, every Job) is replaced
    hotswap: bool = False  # counts as a hotswap: restarted on other capacity, never charged
    preemption: bool = False  # counts as a preemption: stopped whole for higher-priority work
    outcome: str | None = None  # the workload is done: "completed", "failed", "rejected" or "deleted"

    @property
    def message(self) -> str:
        """The action in words: the local timeline's entry and the Kubernetes Event's message."""
        return act.dispatch(self.action, _MESSAGES)


def effect_of(action: act.Action) -> ActionEffect:
    """What ``action`` does to its workload's workers."""
    return act.dispatch(action, _EFFECTS)


def admit_cause(attempt: int) -> str:
    """A first admission starts the run; a later one follows a preemption (requeued)."""
    return "start" if attempt == 1 else "preemption"


def restart_cause(charged: bool) -> str:
    """Charged: the workers failed (an exit code, a hang); not: the infrastructure did."""
    return "failure" if charged else "hotswap"


def with_resume(cause: str | None, resumes: bool) -> str | None:
    """A run's first start that takes its state from elsewhere (a resume source) resumes."""
    return "resume" if cause == "start" and resumes else cause


class _Effects:
    """The :class:`~hotswap.core.actions.ActionHandler` behind :func:`effect_of`."""

    @staticmethod
    def _new_attempt(action: act.Admit | act.Restart, cause: str, replaced: bool, hotswap: bool) -> ActionEffect:
        slices, start = action.slices, action.start
        return ActionEffect(
            action, stop=STOP_OLDER, graceful=not replaced, start=slices if start else (), replicas=slices,
            attempt=action.attempt, generation=slices if start else None, placement=PLACE, held=not start,
            cause=cause, replaced=replaced, hotswap=hotswap,
        )

    def on_reject(self, action: act.Reject) -> ActionEffect:
        return ActionEffect(action, outcome="rejected")

    def on_admit(self, action: act.Admit) -> ActionEffect:
        return self._new_attempt(action, admit_cause(action.attempt), replaced=False, hotswap=False)

    def on_restart(self, action: act.Restart) -> ActionEffect:
        return self._new_attempt(action, restart_cause(action.charged), replaced=True, hotswap=not action.charged)

    def on_start_workers(self, action: act.StartWorkers) -> ActionEffect:
        # Held back by BlockingRecreate or a repair: the cause is the restart's, kept by the backend.
        slices = action.slices
        return ActionEffect(action, start=slices, replicas=slices, attempt=action.attempt, generation=slices)

    def on_preempt(self, action: act.Preempt) -> ActionEffect:
        return ActionEffect(action, stop=STOP_ALL, placement=PARK, preemption=True)

    def on_requeue(self, action: act.Requeue) -> ActionEffect:
        return ActionEffect(action, stop=STOP_ALL, graceful=False, placement=PARK, replaced=True)

    def on_fail(self, action: act.Fail) -> ActionEffect:
        return ActionEffect(action, stop=STOP_ALL, placement=PARK, outcome="failed")

    def on_remove(self, action: act.Remove) -> ActionEffect:
        return ActionEffect(action, stop=STOP_ALL, outcome="deleted")

    def on_complete(self, action: act.Complete) -> ActionEffect:
        return ActionEffect(action, placement=PARK, outcome="completed")

    def on_scale_down(self, action: act.ScaleDown) -> ActionEffect:
        # Giving slices to higher-priority work is coordinated; losing them is not.
        return ActionEffect(
            action, stop=STOP_REMOVED, graceful=action.preemptor is not None, removed=action.removed,
            generation=action.slices, placement=SHRINK,
        )

    def on_scale_up(self, action: act.ScaleUp) -> ActionEffect:
        return ActionEffect(
            action, start=action.added, replicas=action.slices, generation=action.slices, placement=GROW, cause=CAUSE_ELASTIC
        )


class _Messages:
    """What each action says (an :class:`~hotswap.core.actions.ActionHandler`)."""

    def on_reject(self, action: act.Reject) -> str:
        return f"rejected: {action.reason}"

    def on_admit(self, action: act.Admit) -> str:
        waiting = "" if action.start else "; waiting for old workers"
        return f"admitted on {', '.join(action.slices)} (attempt {action.attempt}){waiting}"

    def on_preempt(self, action: act.Preempt) -> str:
        return action.reason

    def on_restart(self, action: act.Restart) -> str:
        waiting = "" if action.start else "; waiting to start"
        return f"restarted on {', '.join(action.slices)} (attempt {action.attempt}): {action.reason}{waiting}"

    def on_start_workers(self, action: act.StartWorkers) -> str:
        return f"workers started on {', '.join(action.slices)} (attempt {action.attempt})"

    def on_requeue(self, action: act.Requeue) -> str:
        return f"requeued: {action.reason}"

    def on_scale_down(self, action: act.ScaleDown) -> str:
        return f"scaled down to {len(action.slices)} slice(s), without {', '.join(action.removed)}: {action.reason}"

    def on_scale_up(self, action: act.ScaleUp) -> str:
        return f"scaled up to {len(action.slices)} slice(s), adding {', '.join(action.added)}"

    def on_fail(self, action: act.Fail) -> str:
        return f"failed: {action.reason}"

    def on_complete(self, action: act.Complete) -> str:
        return "completed: every worker exited 0"

    def on_remove(self, action: act.Remove) -> str:
        return "deleted"


_EFFECTS = _Effects()
_MESSAGES = _Messages()
