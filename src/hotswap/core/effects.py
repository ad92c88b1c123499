"""What an action does to a workload's workers, in one place: :func:`effect_of`.

The local backend, the Kubernetes backend and the simulator only enact an
:class:`ActionEffect` (stop these workers, start those as these replica indexes, publish a
membership generation, record this message); none of them decides again which workers an
action stops, which replica a slice runs, why its workers start, or how it reads in the
timeline. Each computes it once per action. Pure: one action in, one small object out.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable

from hotswap.api.runs import CAUSE_ELASTIC
from hotswap.core import actions as act
from hotswap.core.records import fast_init


class Stop(enum.Enum):
    """Which of the workload's workers stop."""

    NONE = "none"
    ALL = "all"  # every worker of the workload
    OLDER = "older"  # those of attempts before ``ActionEffect.attempt``
    REMOVED = "removed"  # those on ``ActionEffect.removed`` (replica indexes ``parked``)


class Placement(enum.Enum):
    """How the replica map changes; ``ActionEffect.replicas`` is the map after it."""

    KEEP = "keep"  # unchanged (``replicas`` is not this action's to say)
    PLACE = "place"  # every replica placed: replica i on ``replicas[i]``
    PARK = "park"  # no replica runs anywhere
    SHRINK = "shrink"  # the replicas on ``removed`` are parked; the others keep their index
    GROW = "grow"  # ``start`` (the added slices) take parked indexes, lowest first


class Outcome(enum.Enum):
    """How the workload ended, when the action ends it."""

    COMPLETED = "completed"
    FAILED = "failed"
    REJECTED = "rejected"
    DELETED = "deleted"


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class ActionEffect:
    """What ``action`` does to its workload's workers (see :mod:`hotswap.core.actions`)."""

    action: act.Action
    stop: Stop = Stop.NONE  # which workers stop; gracefully: SIGTERM, SIGKILL after the grace period
    graceful: bool = True  # False: the stop follows a loss (work since the last checkpoint is lost)
    removed: tuple[str, ...] = ()  # the slices whose workers stop (Stop.REMOVED)...
    parked: tuple[int, ...] = ()  # ...and their replica indexes, parked
    start: tuple[str, ...] = ()  # slices whose workers start now, each as its replica in ``replicas``
    replicas: tuple[str | None, ...] = ()  # the assignment after the action: replica i on replicas[i] (None: parked)
    attempt: int | None = None  # the attempt its workers start in (None: the workload's current one)
    generation: tuple[str, ...] | None = None  # a new membership generation of these active slices
    placement: Placement = Placement.KEEP  # how the replica map changes
    held: bool = False  # a new attempt whose workers wait for a later StartWorkers
    cause: str | None = None  # why its workers start (START_CAUSES); None: not this action's to say
    replaced: bool = False  # every worker of the workload (on Kubernetes, every Job) is replaced
    hotswap: bool = False  # counts as a hotswap: restarted on other capacity, never charged
    preemption: bool = False  # counts as a preemption: stopped whole for higher-priority work
    outcome: Outcome | None = None  # the workload is done
    event: str | None = None  # what happened, in one word (the Kubernetes Event's reason); None: nothing to report
    warning: bool = False  # it reports a stop, a loss or a refusal (a Warning Event)
    rejection: str | None = None  # why the workload was rejected (Outcome.REJECTED), kept on its JobSet

    @property
    def message(self) -> str:
        """The action in words: the local timeline's entry and the Kubernetes Event's message."""
        return act.dispatch(self.action, _MESSAGES)

    @property
    def requeued(self) -> bool:
        """The workload stops whole and waits in the queue again (preempted or requeued)."""
        return self.placement is Placement.PARK and self.outcome is None

    def replica_of(self, slice_name: str) -> int:
        """The replica index (JOB_INDEX) the workers of ``slice_name``, one of ``start``, start as."""
        return self.replicas.index(slice_name)


def effect_of(action: act.Action) -> ActionEffect:
    """What ``action`` does to its workload's workers."""
    return _EFFECT_OF[type(action)](action)


def effects_of(actions: Iterable[act.Action]) -> list[ActionEffect]:
    """The effect of each action, in order: what a backend computes once per decision."""
    effect_of_type = _EFFECT_OF
    return [effect_of_type[type(action)](action) for action in actions]


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
    def _new_attempt(
        action: act.Admit | act.Restart, cause: str, replaced: bool, hotswap: bool, event: str
    ) -> ActionEffect:
        slices, start = action.slices, action.start
        return ActionEffect(
            action, stop=Stop.OLDER, graceful=not replaced, start=slices if start else (), replicas=slices,
            attempt=action.attempt, generation=slices if start else None, placement=Placement.PLACE, held=not start,
            cause=cause, replaced=replaced, hotswap=hotswap, event=event,
        )

    def on_reject(self, action: act.Reject) -> ActionEffect:
        return ActionEffect(action, outcome=Outcome.REJECTED, event="Rejected", warning=True, rejection=action.reason)

    def on_admit(self, action: act.Admit) -> ActionEffect:
        return self._new_attempt(action, admit_cause(action.attempt), replaced=False, hotswap=False, event="Admitted")

    def on_restart(self, action: act.Restart) -> ActionEffect:
        return self._new_attempt(
            action, restart_cause(action.charged), replaced=True, hotswap=not action.charged, event="Restarted"
        )

    def on_start_workers(self, action: act.StartWorkers) -> ActionEffect:
        # Held back by BlockingRecreate or a repair: the cause is the restart's, kept by the backend.
        # The slices are those reserved meanwhile (a loss may have replaced one): placed anew.
        slices = action.slices
        return ActionEffect(
            action, start=slices, replicas=slices, attempt=action.attempt, generation=slices, placement=Placement.PLACE
        )

    def on_preempt(self, action: act.Preempt) -> ActionEffect:
        return ActionEffect(
            action, stop=Stop.ALL, placement=Placement.PARK, preemption=True, event="Preempted", warning=True
        )

    def on_requeue(self, action: act.Requeue) -> ActionEffect:
        return ActionEffect(
            action, stop=Stop.ALL, graceful=False, placement=Placement.PARK, replaced=True, event="Requeued", warning=True
        )

    def on_fail(self, action: act.Fail) -> ActionEffect:
        return ActionEffect(
            action, stop=Stop.ALL, placement=Placement.PARK, outcome=Outcome.FAILED, event="Failed", warning=True
        )

    def on_remove(self, action: act.Remove) -> ActionEffect:
        return ActionEffect(action, stop=Stop.ALL, outcome=Outcome.DELETED)  # nothing left to report it on

    def on_complete(self, action: act.Complete) -> ActionEffect:
        return ActionEffect(action, placement=Placement.PARK, outcome=Outcome.COMPLETED)  # JobSet reports it itself

    def on_scale_down(self, action: act.ScaleDown) -> ActionEffect:
        # Giving slices to higher-priority work is coordinated; losing them is not.
        return ActionEffect(
            action, stop=Stop.REMOVED, graceful=action.preemptor is not None, removed=action.removed,
            parked=action.parked, replicas=action.replicas, generation=action.slices, placement=Placement.SHRINK,
            event="ScaledDown", warning=True,
        )

    def on_scale_up(self, action: act.ScaleUp) -> ActionEffect:
        return ActionEffect(
            action, start=action.added, replicas=action.replicas, generation=action.slices, placement=Placement.GROW,
            cause=CAUSE_ELASTIC, event="ScaledUp",
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
_EFFECT_OF = act.handler_table(_EFFECTS)
