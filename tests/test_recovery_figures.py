"""The recovery figures both controllers count (``hotswap.backends.kit.figures``): one definition
of a hotswap, a preemption and a recovery, whichever backend runs the workload."""

from __future__ import annotations

import dataclasses

from hotswap.api.phases import WorkloadPhase
from hotswap.api.spec import workload_spec
from hotswap.backends.kit.figures import RecoveryFigures, expected_workers, preemptions_between
from hotswap.core import actions as act
from hotswap.core.effects import effects_of
from hotswap.core.workload import Workload

SPEC = workload_spec(name="w", command="python3 train.py", device_type="v6e-16", num_slices=3, min_slices=2)


class Recorded:
    """What the figures told the metrics."""

    def __init__(self) -> None:
        self.hotswaps = self.preemptions = 0
        self.recoveries: list[float] = []
        self.rounds: list[tuple[float, int]] = []
        self.snapshot: object = None

    def hotswapped(self, count: int = 1) -> None:
        self.hotswaps += count

    def preempted(self, count: int = 1) -> None:
        self.preemptions += count

    def recovered(self, seconds: float) -> None:
        self.recoveries.append(seconds)

    def reconciled(self, seconds: float, writes: int) -> None:
        self.rounds.append((seconds, writes))

    def observed(self, snapshot: object) -> None:
        self.snapshot = snapshot


def running_on(slices: tuple[str, ...], attempt: int) -> Workload:
    return Workload(spec=SPEC, seq=0, created_at=0.0, phase=WorkloadPhase.RUNNING, slices=slices, attempt=attempt)


def test_expected_workers_are_those_of_the_active_slices() -> None:
    """An elastic workload running on 2 of its 3 slices recovers once those 2 slices' hosts run."""
    assert expected_workers(running_on(("a", "b"), 2)) == 2 * 4  # v6e-16: 4 hosts a slice


def test_a_preemption_is_one_more_in_a_workloads_count_than_before_the_round() -> None:
    preempted = dataclasses.replace(running_on((), 1), preemptions=2)
    assert preemptions_between({"w": 1}, {"w": preempted}) == 1
    assert preemptions_between({}, {"w": preempted}) == 0  # no count before: new, or of an earlier release
    assert preemptions_between({"w": "2"}, {"w": preempted}) == 0


def test_a_hotswap_recovers_when_every_worker_of_its_attempt_runs() -> None:
    metrics = Recorded()
    figures = RecoveryFigures(metrics)  # type: ignore[arg-type]
    restart = act.Restart("w", 2, ("x", "b"), "node lost", charged=False)
    decided = effects_of([restart, act.Restart("v", 2, ("y",), "exit 1", charged=True)])
    figures.round_done(decided, {}, {}, now=100.0, loss_since={"w": 90.0})
    assert metrics.hotswaps == 1 and set(figures.recovering) == {"w"}
    workload = running_on(("x", "b"), 2)
    figures.check_recoveries({"w": workload}, lambda w: 7, now=130.0)
    assert metrics.recoveries == []  # one of the 8 workers is not running yet
    figures.check_recoveries({"w": workload}, lambda w: 8, now=140.0)
    assert metrics.recoveries == [50.0] and not figures.recovering  # from the loss, not the restart


def test_a_round_is_reported_in_one_shape_on_both_backends() -> None:
    """What each controller reports of a round: its time and writes, what it counted, and the
    state after it, through one call (both controllers make it)."""
    metrics = Recorded()
    figures = RecoveryFigures(metrics)  # type: ignore[arg-type]
    preempted = dataclasses.replace(running_on((), 1), preemptions=1)
    snapshot = object()
    restart = act.Restart("w", 2, ("x",), "node lost", charged=False)
    figures.account_round(effects_of([restart]), {"w": 0}, {"w": preempted}, snapshot, 5.0, seconds=0.25, writes=3)  # type: ignore[arg-type]
    assert metrics.rounds == [(0.25, 3)] and metrics.snapshot is snapshot
    assert metrics.hotswaps == 1 and metrics.preemptions == 1
