"""MTTR's one definition (hotswap.core.recovery): a failure until the first productive step after it."""

from __future__ import annotations

from hotswap.core.recovery import StepDone, mean_seconds, recoveries


def step(t: float, attempt: int, duration: float = 0.1) -> StepDone:
    return StepDone(t, attempt, t - duration)


def test_a_restart_recovers_at_the_new_attempt_s_first_step_not_an_old_worker_s_late_one() -> None:
    steps = [step(10.0, 1), step(10.7, 1), step(11.5, 2), step(11.6, 2)]  # 10.7: the old attempt, after the failure
    (found,) = recoveries([(10.617, 1)], steps)
    assert found.recovered_at == 11.5 and abs(found.seconds - 0.883) < 1e-9  # type: ignore[operator]


def test_an_elastic_job_recovers_at_its_first_step_begun_after_the_re_formation() -> None:
    steps = [step(10.0, 1), step(10.65, 1, duration=0.2), step(11.3, 1, duration=0.2)]
    (found,) = recoveries([(10.5, 1)], steps, reforms=[(11.0, 1)])
    assert found.recovered_at == 11.3


def test_failures_during_an_open_recovery_are_one_and_an_unrecovered_one_counts_in_no_mean() -> None:
    steps = [step(1.0, 1), step(5.0, 2), step(20.0, 3)]
    found = recoveries([(2.0, 1), (3.0, 1), (10.0, 2), (30.0, 3)], steps)
    assert [(r.failed_at, r.recovered_at) for r in found] == [(2.0, 5.0), (10.0, 20.0), (30.0, None)]
    assert mean_seconds(found) == (3.0 + 10.0) / 2
    assert mean_seconds([]) is None
